"""Where a site sends its carry ahead (``RoundEngine._flush``): never into a round a peer must refuse."""

from __future__ import annotations

from gateways.rounds.actions import Action, Send
from gateways.rounds.engine import RoundEngine
from tools.harness.exact_payloads import make_payload


def test_a_carry_is_never_sent_ahead_into_a_round_older_than_a_contribution_it_holds() -> None:
    """A peer refuses a message naming a contribution from a later iteration than its round (chaos soak,
    quick seed 3: a carried (b, 24) sent ahead into round 23 made a drop b, take it back at 23, and drop
    it again, over and over). The carry of a settled round can hold a contribution newer than the first
    round without a result here."""
    engine = RoundEngine("b", "abc")  # tree: a is the root, b a child
    for it in range(25):
        engine.local_push(it, 0, make_payload("b", it, 0), 0.0)  # rounds 0..24 open, waiting for a
    engine._finished.newest[0] = 22  # results up to 22 here; the parent's hint points at 23
    engine._ledger.hints[0] = 23
    del engine._rounds[(24, 0)]  # round 24 ended here without a result: its contribution is carried
    engine._carry_add(0, make_payload("b", 24, 0), (("b", 24),))
    out: list[Action] = []
    engine._flush(0, 1.0, out)  # every open round already sent its partial: the carry goes ahead
    extras = [a.msg for a in out if isinstance(a, Send) and a.msg.kind == "extra"]
    assert extras and all(m.iteration >= max(it for _, it in m.sites) for m in extras)


def test_a_round_re_run_after_a_rejoin_does_not_take_a_carry_newer_than_itself() -> None:
    """The same rule for a site's own contribution: an open round older than a carried contribution
    leaves the carry to a later round."""
    engine = RoundEngine("b", "abc")
    engine._carry_add(0, make_payload("b", 24, 0), (("b", 24),))
    engine._frontier = 24
    out = engine.local_push(23, 0, make_payload("b", 23, 0), 1.0)
    partials = [a.msg for a in out if isinstance(a, Send) and a.msg.kind == "partial"]
    assert partials and all(m.iteration >= max(it for _, it in m.sites) for m in partials)
    assert [ids for _, ids in engine.held(0) if ("b", 24) in ids]  # still held, for a later round
