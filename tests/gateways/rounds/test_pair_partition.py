"""A partition between two sites only (chaos soak finding 1): each drops the other, the rest drop neither.

The two then run plans the others do not know for the rounds in flight; a site whose parent differs in its
plan hands that parent a partial the parent holds (an unknown plan) while finishing the round under its own.
The held partial must be answered with the result, or the site waits for it forever with the link up.
"""

from __future__ import annotations

import pytest

from gateways.membership.joining import LinkInfo, join_iteration
from gateways.rounds.config import RoundConfig
from tests.gateways.harness import Net, Trainers, assert_accounted
from wanrt.protocol.peer.round_msg import RoundMsg

SITES = "abcdef"


class StrictTrainers(Trainers):
    """Like the real trainer: iteration n starts only once every round up to n - 1 - staleness has
    answered (the harness's trainers may skip to the newest finished iteration, which hides a wedge)."""

    def _ready(self, site: str, n: int) -> bool:
        need = n - 1 - self.staleness
        done = self.resolved[site]
        return all(len(done.get(i, ())) == self.layers for i in range(need + 1))

    def _maybe_start(self, site: str) -> None:
        self.newest[site] = -1  # never skip ahead
        super()._maybe_start(site)


def _rejoin_at(net: Net, x: str, y: str, cfg: RoundConfig) -> int:
    """The iteration two running gateways take each other back from, as their handshake decides it."""
    info = {
        s: LinkInfo(net.engines[s].frontier, False, low=net.engines[s].oldest_unfinished()) for s in (x, y)
    }
    at = join_iteration(info[x], info[y], margin=cfg.window)
    assert at == join_iteration(info[y], info[x], margin=cfg.window)
    return at


def _partition(flaps: int, *, until: float = 400.0) -> tuple[Net, StrictTrainers]:
    cfg = RoundConfig(topology="tree", round_deadline_s=3.0, suspect_after_s=3.0)
    net = Net(SITES, cfg.spec(), cfg)
    tr = StrictTrainers(net, iterations=40, layers=3, compute=0.05)
    pair = {"d", "f"}  # tree a->(b, c), b->(d, e), c->f; without d, f's parent is b
    cut = [False]

    def drop(src: str, dst: str, m: RoundMsg, now: float) -> bool:
        return cut[0] and {src, dst} == pair

    net.drop = drop
    tr.start()
    net.run(until=0.5)
    cut[0] = True
    net.lose("d", "f")
    net.lose("f", "d")
    for k in range(flaps):  # redials that come up and are reset again at once (the soak's partition)
        net.run(until=0.5 + 2.5 * (k + 1) / (flaps + 1))
        at = _rejoin_at(net, "d", "f", cfg)
        net.join("d", "f", at)
        net.join("f", "d", at)
        net.lose("d", "f")
        net.lose("f", "d")
    net.run(until=3.0)
    cut[0] = False
    at = _rejoin_at(net, "d", "f", cfg)
    net.join("d", "f", at)
    net.join("f", "d", at)
    net.run(until=until)
    return net, tr


def test_a_short_partition_between_two_sites_does_not_wedge_the_job() -> None:
    net, tr = _partition(flaps=0)
    assert all(tr.next_it[s] == 40 for s in SITES), tr.next_it  # every trainer ran to the end
    assert all(not e.open_rounds() for e in net.engines.values())
    assert not net.errors
    assert_accounted(net)  # nothing lost, nothing counted twice


def test_a_flapping_partition_between_two_sites_does_not_wedge_the_job() -> None:
    net, tr = _partition(flaps=10)
    assert all(tr.next_it[s] == 40 for s in SITES), tr.next_it
    assert all(not e.open_rounds() for e in net.engines.values())
    assert not net.errors
    assert_accounted(net)
    # the site whose parent differed was answered from the parent's held messages
    assert net.engines["b"].stats.final_replies > 0


def test_after_the_partition_every_site_runs_the_same_plan_for_every_open_round() -> None:
    """Taken back from the oldest round either still had open, the two run the plans every other site
    runs (which never lost either), so nothing waits on a plan only two sites know."""
    net, _ = _partition(flaps=3, until=3.0)
    iterations = {i for e in net.engines.values() for i, _ in e.open_rounds()}
    assert iterations
    for i in iterations:
        assert len({e.plan_for(i).plan_id for e in net.engines.values()}) == 1, i


def _cut_off_f(net: Net, cut_for: float) -> list[str]:
    """From t = 1 s, f hears nobody; at 2 s every pair with f is declared lost; the cut lasts ``cut_for``
    more seconds. Returns the other sites."""
    net.run(until=1.0)
    net.cut.add("f")
    net.run(until=2.0)
    others = [s for s in SITES if s != "f"]
    for s in others:
        net.lose(s, "f")
        net.lose("f", s)
    net.run(until=2.0 + cut_for)
    return others


def _rejoin_f(net: Net, others: list[str], cfg: RoundConfig) -> None:
    """The cut ends: f and every other site take each other back by the join rule, and the job runs out."""
    net.cut.discard("f")
    for s in others:
        net.join(s, "f", _rejoin_at(net, s, "f", cfg))
        net.join("f", s, _rejoin_at(net, "f", s, cfg))
    net.run(until=500.0)


@pytest.mark.parametrize("cut_for", [0.1, 0.3, 1.0])
def test_a_site_cut_off_from_everyone_rejoins_without_counting_anything_twice(cut_for: float) -> None:
    """The running-pair rule must not re-run rounds whose results the others no longer keep: re-run, such a
    round waits until pruned, is abandoned, and its contribution (counted already) is carried and counted
    again — which allowing frontiers ``retain_finals`` apart did after a 0.3 s cut."""
    cfg = RoundConfig(topology="tree", round_deadline_s=0.5, suspect_after_s=1.0)
    net = Net(SITES, cfg.spec(), cfg)
    tr = Trainers(net, iterations=120, layers=3, compute=0.05)
    tr.start()
    others = _cut_off_f(net, cut_for)
    _rejoin_f(net, others, cfg)
    assert not net.errors
    assert_accounted(net)


@pytest.mark.parametrize("cut_for", [3.0, 8.0])
def test_a_site_cut_off_for_longer_than_the_outcome_history_is_settled_exactly(cut_for: float) -> None:
    """Cut off while the job runs on past ``outcome_history`` iterations (chaos soak, full seed 2: a
    gateway down 5 s came back 50–75 iterations behind): the rejoin's outcomes must still say which of its
    held contributions were counted. With the last 64 iterations' result ids as the record, they could not,
    and the site carried contributions a result had counted already (counted twice)."""
    cfg = RoundConfig(topology="tree", round_deadline_s=0.5, suspect_after_s=1.0)
    net = Net(SITES, cfg.spec(), cfg)
    tr = Trainers(net, iterations=400, layers=3, compute=0.02)
    tr.start()
    others = _cut_off_f(net, cut_for)
    frontier = max(net.engines[s].frontier for s in others)
    assert frontier - net.engines["f"].frontier > cfg.outcome_history  # the job ran on past the record
    _rejoin_f(net, others, cfg)
    assert not net.errors
    assert net.engines["f"].stats.unresolved == 0
    assert_accounted(net)
