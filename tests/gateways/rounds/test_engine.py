"""The round engine on virtual time: exact aggregates in every topology, x-order, failures, bad peers."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateways.rounds.actions import Deliver, PeerSuspect, RoundClosed, Send
from gateways.rounds.aggregate import aggregate_cap, per_site_cap
from gateways.rounds.config import RoundConfig
from gateways.rounds.engine import RoundEngine
from gateways.rounds.topology import PlanSpec, build_plan
from tests.gateways.harness import Net, Trainers, assert_accounted, divergent, layer_shape, make_payload
from wanrt.errors import ConfigError, LimitExceeded, LocalProtocolError, MalformedPayload, RemoteProtocolError
from wanrt.payload import SparsePayload
from wanrt.protocol.peer.round_msg import RoundMsg

SITES = "abcd"
KINDS = ["star", "tree", "ring", "parent_child", "allpairs"]


def _run(net: Net, iterations: int, layers: int, **kw: object) -> Trainers:
    tr = Trainers(net, iterations=iterations, layers=layers, **kw)  # type: ignore[arg-type]
    tr.start()
    net.run()
    return tr


def _folded(finals: dict[tuple[int, int], Deliver]) -> set[tuple[str, int, int]]:
    """(site, pushed at, counted in) for every contribution counted in a later round than its own."""
    return {(s, it, i) for (i, _), d in finals.items() for s, it in d.sites if it != i}


# --------------------------------------------------------------------------------------------------------
# every topology, healthy WAN: 4 gateways x 200 iterations x 10 layers, checked exactly
# --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_every_topology_sums_exactly_and_identically(kind: str) -> None:
    spec = PlanSpec.make(kind, costs={"a": 0.1, "b": 0.2, "c": 0.3, "d": 0.4})  # type: ignore[arg-type]
    net = Net(SITES, spec, RoundConfig(round_deadline_s=1.0))
    _run(net, 200, 10)
    assert not net.errors
    finals = assert_accounted(net)  # identical at every site, Σ results == Σ pushes, each push once
    assert len(finals) == 200 * 10
    for s in SITES:  # every site got every round, with every site's own push in it
        assert len(net.delivered[s]) == 2000
    assert all(d.sites == tuple((s, i) for s in SITES) for (i, _), d in finals.items())
    assert all(e.stats.carried == 0 and e.stats.restarts == 0 for e in net.engines.values())
    # memory stays bounded by the windows, not by the run length
    for e in net.engines.values():
        assert not e.open_rounds()
        assert len(e._finished.finals) <= (e.config.retain_finals + 1) * 10


@pytest.mark.parametrize("kind", ["tree", "ring", "allpairs"])
@pytest.mark.parametrize("policy", ["per_site", "cap"])
def test_bounded_forwarding_keeps_all_mass(kind: str, policy: str) -> None:
    cfg = RoundConfig(forward_policy=policy, forward_density=0.1)  # type: ignore[arg-type]
    net = Net(SITES, PlanSpec.make(kind), cfg)  # type: ignore[arg-type]
    _run(net, 40, 4)
    assert not net.errors
    finals = assert_accounted(net)  # the residuals are "held": Σ forwarded + Σ residual == Σ pushed
    for (_, layer), d in finals.items():
        assert d.payload is not None
        dense_len, bs = layer_shape(layer)
        if policy == "cap":  # a ring (all-pairs) caps each of its 4 segments, rounding each up
            bound = aggregate_cap(dense_len, bs, 0.1) + (4 if kind != "tree" else 0)
        else:
            bound = 4 * per_site_cap(dense_len, bs, 0.1, 4)
        assert d.payload.nnz_blocks <= bound
    held = sum(
        p.nnz_blocks
        for e in net.engines.values()
        for lay in range(4)
        for p, _ in e.held(lay)
        if p is not None
    )
    assert held > 0  # something was actually held back


# --------------------------------------------------------------------------------------------------------
# x-order: late children are skipped and fold their contribution into the next round
# --------------------------------------------------------------------------------------------------------
def test_late_child_is_skipped_and_folded_into_the_next_round() -> None:
    net = Net(SITES, PlanSpec.make("star"), RoundConfig(round_deadline_s=0.2))
    # d's uplink to the root stalls for iterations 10..14
    net.delay = lambda src, dst, m, now: 0.5 if src == "d" and 10 <= m.iteration < 15 else 0.0
    _run(net, 40, 3)
    assert not net.errors
    finals = assert_accounted(net)
    folded = _folded(finals)
    assert folded and all(s == "d" and it >= 10 and i > it for s, it, i in folded)
    root_closed = [c for c in net.closed["a"] if "d" in c.late]
    assert root_closed and all(c.iteration >= 10 for c in root_closed)  # (a stream backs up behind)
    assert net.engines["d"].stats.carried > 0 and net.engines["a"].stats.late_inputs > 0


def test_a_dropped_partial_is_recovered_by_x_order() -> None:
    net = Net(SITES, PlanSpec.make("tree"), RoundConfig(round_deadline_s=0.2))
    lost = []

    def drop(src: str, dst: str, m: RoundMsg, now: float) -> bool:
        if src == "d" and m.kind == "partial" and (m.iteration, m.layer) == (7, 1):
            lost.append(m)
            return True
        return False

    net.drop = drop
    _run(net, 20, 2)
    assert lost and not net.errors
    finals = assert_accounted(net)
    assert ("d", 7) not in finals[(7, 1)].sites
    assert any(s == "d" and it == 7 and layer == 1 for (_, layer), d in finals.items() for s, it in d.sites)


def test_straggler_under_parent_child_does_not_slow_the_ring() -> None:
    compute = {"a": 0.05, "b": 0.05, "c": 0.05, "d": 0.4}
    cfg = RoundConfig(round_deadline_s=1.0, t_w_s=0.02)
    ring = Net(SITES, PlanSpec.make("ring"), cfg)
    _run(ring, 40, 3, compute=compute)
    pc = Net(SITES, PlanSpec.make("parent_child", stragglers=["d"]), cfg)
    _run(pc, 40, 3, compute=compute)
    assert not ring.errors and not pc.errors
    assert_accounted(ring)
    finals = assert_accounted(pc)
    plan = pc.engines["a"].plan_for(0)
    assert plan.parent_of("d") == "a" and plan.waits_tw == {"d"}
    # the straggler's pushes are folded into later rounds instead of holding everybody back
    assert any(s == "d" for s, _, _ in _folded(finals))
    assert max(c.duration for c in pc.closed["b"] if c.iteration < 40) < 0.4
    last = lambda net: max(t for (i, _), t in net.delivered_at["b"].items() if i < 40)  # noqa: E731
    assert max(pc.delivered["b"])[0] >= 39 and max(ring.delivered["b"])[0] == 39
    assert last(pc) < last(ring) / 3  # the plain ring waited for d every round


# --------------------------------------------------------------------------------------------------------
# failures: a site goes silent and comes back; the root is lost; the plan changes mid-run
# --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kind,silent",
    [("star", "c"), ("star", "a"), ("tree", "b"), ("ring", "c"), ("parent_child", "d"), ("allpairs", "b")],
)
def test_silent_site_comes_back_and_everything_is_accounted(kind: str, silent: str) -> None:
    cfg = RoundConfig(round_deadline_s=0.3, suspect_after_s=0.5)
    costs = {"a": 0.1, "b": 0.2, "c": 0.3, "d": 0.4}
    spec = PlanSpec.make(kind, costs=costs, stragglers=["d"] if kind == "parent_child" else ())  # type: ignore[arg-type]
    net = Net(SITES, spec, cfg)
    tr = Trainers(net, iterations=60, layers=3, compute=0.05)
    tr.start()
    others = [s for s in SITES if s != silent]
    net.run(until=0.93)  # mid-round
    net.cut.add(silent)
    cut_at = net.engines[silent].frontier
    net.run(until=1.5)  # the others notice after a while
    for s in others:
        net.lose(s, silent)
        net.lose(silent, s)
    before = {s: len(net.delivered[s]) for s in others}
    net.run(until=3.0)
    assert all(len(net.delivered[s]) > before[s] + 9 for s in others)  # they keep completing rounds
    held_out = len(net.delivered[silent])
    net.cut.discard(silent)
    join_at = max(net.engines[s].frontier for s in others) + 1
    for s in others:
        net.join(s, silent, join_at)
        net.join(silent, s, join_at)
    tr.resume(silent, join_at)
    net.run()
    assert not net.errors
    finals = assert_accounted(net, authority=others)
    # at most the rounds the silent site finished as it was cut off differ (their results never left it)
    private = divergent(net, others)
    assert all(s == silent and abs(i - cut_at) <= 2 for s, (i, _) in private)
    assert len(net.delivered[silent]) > held_out  # it takes part again
    e = net.engines[silent]
    assert e.stats.settled > 0 and e.stats.unresolved == 0 and e.stats.abandoned == 0
    assert max(it for (it, _) in finals) == 59
    # what it pushed while cut off was carried into the rounds after it rejoined
    assert any(s == silent and i >= join_at for s, _, i in _folded(finals))


def test_lost_root_mid_run_without_return() -> None:
    net = Net(SITES, PlanSpec.make("tree"), RoundConfig(round_deadline_s=0.3))
    tr = Trainers(net, iterations=50, layers=3, compute=0.05)
    tr.start()
    net.run(until=0.71)
    net.cut.add("a")
    net.run(until=1.0)
    for s in "bcd":
        net.lose(s, "a")
    net.run()
    assert not net.errors
    assert_accounted(net, authority="bcd", lost="a")  # a's pushes counted only in its private results
    assert all(i <= 14 for _, (i, _) in divergent(net, "bcd"))
    assert max(i for (i, _) in net.delivered["b"]) == 49
    assert net.engines["b"].plan_for(49).core == ("b",)


def test_scheduler_switches_topology_at_the_same_iteration_everywhere() -> None:
    net = Net(SITES, PlanSpec.make("ring"), RoundConfig())
    tr = Trainers(net, iterations=60, layers=3)
    tr.start()
    net.run(until=1.0)
    switch = max(e.frontier for e in net.engines.values()) + 2
    net.set_spec(PlanSpec.make("parent_child", stragglers=["b"]), effective=switch)
    net.run()
    assert not net.errors
    assert_accounted(net)
    e = net.engines["a"]
    assert e.plan_for(switch - 1).core == tuple(SITES) and e.plan_for(switch).waits_tw == {"b"}


def test_switch_for_rounds_in_flight_restarts_them() -> None:
    net = Net(SITES, PlanSpec.make("star"), RoundConfig())
    tr = Trainers(net, iterations=30, layers=3)
    tr.start()
    net.run(until=0.52)
    net.set_spec(PlanSpec.make("tree"))  # effective for every unfinished round
    net.run()
    assert not net.errors
    assert_accounted(net)
    assert sum(e.stats.restarts for e in net.engines.values()) > 0


def test_join_without_an_iteration_takes_the_next_one() -> None:
    e = _engine("a")
    e.local_push(4, 0, make_payload("a", 4, 0), now=0.0)
    e.peer_lost("d", now=0.0)
    out = e.peer_joined("d", now=0.1)
    assert e.plan_for(4).members == ("a", "b", "c") and e.plan_for(5).members == tuple(SITES)
    # what was counted before 5 is told once known: round 4, in flight here with a quorum, finishes first
    assert not [a for a in out if isinstance(a, Send) and a.peer == "d"]
    for child in "bc":
        out = e.peer_message(child, _partial(e, child, it=4), now=0.2)
    outcome = [a for a in out if isinstance(a, Send) and a.peer == "d"]
    assert [(a.peer, a.kind, a.iteration) for a in outcome] == [("d", "outcome", 5)]


def test_cut_off_site_does_not_train_alone() -> None:
    net = Net(SITES, PlanSpec.make("star"), RoundConfig(round_deadline_s=0.2))
    net.cut.add("d")
    for s in "abc":
        net.lose("d", s)
    net.push("d", 0, 0, make_payload("d", 0, 0))
    net.run()
    assert not net.delivered["d"]  # one site of four is no quorum
    assert net.engines["d"].open_rounds() == [(0, 0)]


# --------------------------------------------------------------------------------------------------------
# deadlines and suspects, one engine at a time
# --------------------------------------------------------------------------------------------------------
def _engine(site: str = "a", kind: str = "star", **cfg: object) -> RoundEngine:
    spec = PlanSpec.make(kind)  # type: ignore[arg-type]
    return RoundEngine(site, SITES, spec, RoundConfig(**cfg))  # type: ignore[arg-type]


def _partial(e: RoundEngine, child: str, it: int = 0, layer: int = 0) -> RoundMsg:
    plan = e.plan_for(it)
    return RoundMsg("partial", it, layer, plan.plan_id, make_payload(child, it, layer), ((child, it),))


def test_root_proceeds_at_the_deadline_without_the_missing_child() -> None:
    e = _engine(round_deadline_s=1.0)
    assert e.local_push(0, 0, make_payload("a", 0, 0), now=0.0) == []
    assert e.peer_message("b", _partial(e, "b"), now=0.1) == []
    assert e.peer_message("c", _partial(e, "c"), now=0.2) == []
    assert e.next_deadline() == pytest.approx(1.0)
    assert e.tick(0.99) == []
    out = e.tick(1.0)
    deliver = next(a for a in out if isinstance(a, Deliver))
    closed = next(a for a in out if isinstance(a, RoundClosed))
    sends = [a for a in out if isinstance(a, Send)]
    assert deliver.sites == (("a", 0), ("b", 0), ("c", 0))
    assert closed.late == ("d",) and closed.missing == ("d",)
    assert sorted(s.peer for s in sends) == ["b", "c", "d"] and all(s.kind == "final" for s in sends)
    assert all(s.priority == (0, 0) for s in sends)
    # d's partial arrives late: ignored here (d carries it), no second result
    assert e.peer_message("d", _partial(e, "d"), now=1.5) == []
    assert e.next_deadline() is None


def test_parent_waits_only_t_w_for_a_straggler() -> None:
    e = RoundEngine("a", SITES, PlanSpec.make("star", stragglers=["d"]), RoundConfig(t_w_s=0.05))
    for c in "bc":
        e.peer_message(c, _partial(e, c), now=0.0)
    e.local_push(0, 0, make_payload("a", 0, 0), now=0.3)
    assert e.next_deadline() == pytest.approx(0.35)
    out = e.tick(0.35)
    assert any(isinstance(a, Deliver) for a in out)


def test_ring_member_suspects_its_silent_predecessor() -> None:
    e = _engine("b", "ring", suspect_after_s=2.0)
    out = e.local_push(0, 0, make_payload("b", 0, 0), now=0.0)
    assert [(a.peer, a.kind) for a in out if isinstance(a, Send)] == [("c", "segment")]
    assert e.next_deadline() == pytest.approx(2.0)
    sus = [a for a in e.tick(2.0) if isinstance(a, PeerSuspect)]
    assert len(sus) == 1 and sus[0].peer == "a" and sus[0].reason == "ring"
    assert e.tick(10.0) == []  # once per wait, not a flood


def test_late_local_push_is_carried() -> None:
    e = _engine("b")
    plan = e.plan_for(0)
    final = RoundMsg("final", 0, 0, plan.plan_id, make_payload("a", 0, 0), (("a", 0),))
    out = e.peer_message("a", final, now=0.0)
    assert isinstance(out[0], Deliver)
    # too late for round 0: sent ahead as an extra into the round a gathers next (hint 0 -> round 1)
    (extra,) = e.local_push(0, 0, make_payload("b", 0, 0), now=0.1)
    assert isinstance(extra, Send) and (extra.peer, extra.kind, extra.iteration) == ("a", "extra", 1)
    assert extra.sites == (("b", 0),)
    ((_, ids),) = e.held(0)
    assert ids == (("b", 0),)  # retained until a result lists it
    out = e.local_push(1, 0, make_payload("b", 1, 0), now=0.2)
    (partial,) = [a for a in out if isinstance(a, Send)]
    assert partial.kind == "partial" and partial.sites == (("b", 1),)
    # a moved on without the extra: b carries it again and, with no open round to ride along, resends it
    final = RoundMsg("final", 1, 0, plan.plan_id, make_payload("a", 1, 0), (("a", 1), ("b", 1)), step=3)
    out = e.peer_message("a", final, now=0.3)
    (again,) = [a for a in out if isinstance(a, Send)]
    assert (again.kind, again.iteration, again.sites) == ("extra", 3, (("b", 0),))
    assert again.payload is not None
    np.testing.assert_array_equal(again.payload.to_dense(), make_payload("b", 0, 0).to_dense())


# --------------------------------------------------------------------------------------------------------
# bad peers get typed errors naming them, and the engine keeps working
# --------------------------------------------------------------------------------------------------------
def test_bad_peer_input_is_rejected_with_typed_errors() -> None:
    e = _engine("a", "star", window=3)
    pid = e.plan_for(0).plan_id
    ok = make_payload("b", 0, 0)
    with pytest.raises(LimitExceeded) as far:
        e.peer_message("b", RoundMsg("partial", 100, 0, pid, ok, (("b", 100),)), now=0.0)
    assert far.value.fields["peer"] == "b" and far.value.fields["name"] == "window"
    with pytest.raises(RemoteProtocolError) as unknown:
        e.peer_message("zz", _partial(e, "b"), now=0.0)
    assert unknown.value.fields["peer"] == "zz"
    with pytest.raises(LimitExceeded):
        e.peer_message("b", RoundMsg("partial", 0, 1 << 20, pid, None, ()), now=0.0)
    with pytest.raises(RemoteProtocolError):  # an id from the future
        e.peer_message("b", RoundMsg("partial", 0, 0, pid, ok, (("b", 5),)), now=0.0)
    with pytest.raises(LimitExceeded):
        e.peer_message("b", RoundMsg("partial", 0, 0, pid, ok, (("b", 0),) * 10_000), now=0.0)
    wrong_shape = SparsePayload(0, 999, 16, np.zeros(0, np.int64), np.zeros(0, np.float32))
    e.local_push(0, 0, ok, now=0.0)
    with pytest.raises(MalformedPayload) as shape:
        e.peer_message("c", RoundMsg("partial", 0, 0, pid, wrong_shape, (("c", 0),)), now=0.0)
    assert shape.value.fields["peer"] == "c"
    e.peer_message("b", _partial(e, "b"), now=0.0)
    with pytest.raises(RemoteProtocolError):  # duplicate
        e.peer_message("b", _partial(e, "b"), now=0.0)
    with pytest.raises(RemoteProtocolError):  # b is not a's ring predecessor (and a star has no ring)
        e.peer_message("b", RoundMsg("segment", 0, 0, pid, ok, (("b", 0),), 0, 0), now=0.0)
    with pytest.raises(RemoteProtocolError):  # outcomes may only list the receiver's own ids
        e.peer_message("b", RoundMsg("outcome", 1, 0, 0, None, (("b", 0),), 0), now=0.0)
    with pytest.raises(LocalProtocolError):
        e.peer_lost("a", now=0.0)
    # still works after all that
    e.peer_message("c", _partial(e, "c"), now=0.1)
    out = e.peer_message("d", _partial(e, "d"), now=0.2)
    assert any(isinstance(a, Deliver) and len(a.sites) == 4 for a in out)
    with pytest.raises(RemoteProtocolError):  # long settled
        for it in range(1, 80):
            e.local_push(it, 0, make_payload("a", it, 0), now=1.0)
        e.peer_message("b", _partial(e, "b", it=0), now=2.0)


def test_ring_rejects_misplaced_segments() -> None:
    e = _engine("b", "ring")
    pid = e.plan_for(0).plan_id
    e.local_push(0, 0, make_payload("b", 0, 0), now=0.0)
    dense_len, bs = layer_shape(0)
    foreign = SparsePayload.from_dense_blocks(0, np.ones(dense_len, np.float32), np.array([0]), bs)
    with pytest.raises(RemoteProtocolError):  # step 0 from a must carry a's own segment 0
        e.peer_message("a", RoundMsg("segment", 0, 0, pid, foreign, (("a", 0),), 0, 1), now=0.0)
    last = SparsePayload.from_dense_blocks(0, np.ones(dense_len, np.float32), np.array([2]), bs)
    with pytest.raises(MalformedPayload):  # segment 0 of 4 cannot hold the last block
        e.peer_message("a", RoundMsg("segment", 0, 0, pid, last, (("a", 0),), 0, 0), now=0.0)
    with pytest.raises(RemoteProtocolError):
        e.peer_message("c", RoundMsg("segment", 0, 0, pid, foreign, (("c", 0),), 0, 0), now=0.0)


def test_local_misuse_and_config_validation() -> None:
    e = _engine()
    e.local_push(3, 0, make_payload("a", 3, 0), now=0.0)
    with pytest.raises(RemoteProtocolError):
        e.local_push(3, 0, make_payload("a", 3, 0), now=0.0)  # pushes must advance
    with pytest.raises(MalformedPayload):
        e.local_push(4, 1, make_payload("a", 4, 0), now=0.0)  # payload of another layer
    with pytest.raises(ConfigError):
        RoundEngine("zz", SITES)
    with pytest.raises(ConfigError) as bad:
        RoundConfig(window=0)
    assert bad.value.fields["key"] == "window"
    with pytest.raises(ConfigError):
        RoundConfig(forward_policy="drop")  # type: ignore[arg-type]
    plan = build_plan(PlanSpec.make("ring"), "abc")
    assert RoundEngine("a", SITES, plan).live == {"a", "b", "c"}


def test_messages_for_an_unknown_plan_wait_until_it_is_adopted() -> None:
    spec = PlanSpec.make("tree", arity=1, costs={"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0})  # a <- b <- c <- d
    b = RoundEngine("b", SITES, spec, RoundConfig())
    d = RoundEngine("d", SITES, spec, RoundConfig())
    d.peer_lost("c", now=0.0)  # d hears first that c is lost: its new parent is b
    (send,) = [x for x in d.local_push(0, 0, make_payload("d", 0, 0), now=0.0) if isinstance(x, Send)]
    assert send.peer == "b" and send.kind == "partial"
    assert b.peer_message("d", send.msg, now=0.1) == [] and b.stats.buffered == 1  # not b's child yet
    b.local_push(0, 0, make_payload("b", 0, 0), now=0.1)
    out = b.peer_lost("c", now=0.2)  # now it is: the held partial joins the round
    (up,) = [x for x in out if isinstance(x, Send)]
    assert up.peer == "a" and up.sites == (("b", 0), ("d", 0))
    assert b.stats.buffer_dropped == 0


# --------------------------------------------------------------------------------------------------------
# fuzz: whatever a peer sends, the engine answers with actions or a RemoteProtocolError, never a crash
# --------------------------------------------------------------------------------------------------------
_PEERS = ["a", "b", "c", "d", "zz"]
_KINDS = ["partial", "extra", "segment", "segment_final", "final", "outcome", "bogus"]
_FIELDS = st.tuples(
    st.integers(0, len(_PEERS) - 1),  # sender
    st.integers(0, len(_KINDS) - 1),  # kind
    st.integers(-2, 8),  # iteration
    st.integers(-1, 3),  # layer
    st.integers(0, 3),  # plan id: the current one, after a loss, 0, garbage
    st.integers(0, 2),  # payload: none, right shape, wrong shape
    st.integers(0, 2**16),  # block choice
    st.lists(st.tuples(st.integers(0, len(_PEERS) - 1), st.integers(-1, 6)), max_size=5),
    st.booleans(),  # sort the ids (valid form) or not
    st.integers(-1, 4),  # step
    st.integers(-1, 4),  # segment
)


def _fuzzed(fields: tuple[Any, ...], plan_ids: list[int]) -> tuple[str, RoundMsg]:
    peer, kind, it, layer, pid, pay, blocks, ids, canon, step, seg = fields
    dense_len, bs = layer_shape(max(layer, 0))
    payload = None
    if pay:
        dense_len += 5 if pay == 2 else 0
        nb = -(-dense_len // bs)
        idx = np.array([b for b in range(min(nb, 16)) if blocks >> b & 1], np.int64)
        payload = SparsePayload(max(layer, 0), dense_len, bs, idx, np.ones(len(idx) * bs, np.float32))
    sites = tuple((_PEERS[p], i) for p, i in ids)
    if canon:
        sites = tuple(sorted(set(sites)))
    plan_id = [*plan_ids, 0, 12345][pid]
    return _PEERS[peer], RoundMsg(_KINDS[kind], it, layer, plan_id, payload, sites, step, seg)


@pytest.mark.parametrize("kind", ["star", "ring", "parent_child", "allpairs"])
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_peer_messages_never_crash_the_engine(kind: str, data: st.DataObject) -> None:
    spec = PlanSpec.make(kind, stragglers=["d"] if kind == "parent_child" else ())  # type: ignore[arg-type]
    e = RoundEngine("b", SITES, spec, RoundConfig(max_lag=4, window=3, retain_finals=3))
    plan_ids = [e.plan_for(0).plan_id, build_plan(spec, "abc").plan_id]
    now = 0.0
    for it in range(3):
        e.local_push(it, 0, make_payload("b", it, 0), now)
        for _ in range(data.draw(st.integers(1, 6))):
            peer, msg = _fuzzed(data.draw(_FIELDS), plan_ids)
            now += 0.01
            try:
                actions = e.peer_message(peer, msg, now)
            except RemoteProtocolError:
                continue
            except LocalProtocolError:
                assert peer == "b"
                continue
            for a in actions:
                assert isinstance(a, (Send, Deliver, RoundClosed, PeerSuspect))
        if data.draw(st.booleans()):
            e.tick(now + 5.0)
        if data.draw(st.booleans()):
            e.peer_lost(data.draw(st.sampled_from(["a", "c", "d"])), now)
    assert len(e.open_rounds()) <= (e.config.max_lag + e.config.window + 1) * 4  # layers 0..3


# --------------------------------------------------------------------------------------------------------
# wire dtype end to end: fp16 pushes travel every hop as fp16, and every site gets the same values
# --------------------------------------------------------------------------------------------------------
def _fp16(p: SparsePayload) -> SparsePayload:
    return SparsePayload(p.layer, p.dense_len, p.block_size, p.indices, p.values.astype(np.float16), "fp16")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("partial_sums", ["wire", "fp32"])
def test_fp16_pushes_travel_every_hop_in_fp16(kind: str, partial_sums: str) -> None:
    spec = PlanSpec.make(kind, costs={"a": 0.1, "b": 0.2, "c": 0.3, "d": 0.4})  # type: ignore[arg-type]
    net = Net(SITES, spec, RoundConfig(round_deadline_s=1.0, partial_sums=partial_sums))
    sent: list[RoundMsg] = []
    net.listeners.append(lambda site, a: sent.append(a.msg) if isinstance(a, Send) else None)
    pushed: dict[tuple[int, int], list[SparsePayload]] = {}
    for it in range(6):
        for layer in range(2):
            for s in SITES:
                p = _fp16(make_payload(s, it, layer))
                pushed.setdefault((it, layer), []).append(p)
                net.push(s, it, layer, p)
        net.run(until=net.now + 5.0)
    net.run()
    assert not net.errors
    carried = [m.payload for m in sent if m.payload is not None]
    want = "fp16" if partial_sums == "wire" else "fp32"
    assert carried and {p.value_dtype for p in carried} == {want}  # "wire": never widened on the WAN
    for key, ins in pushed.items():
        got = [net.delivered[s][key].payload for s in SITES]
        assert len({bytes(np.asarray(p.values).tobytes()) for p in got}) == 1  # identical everywhere
        assert {p.value_dtype for p in got} == {want}
        exact = sum(p.to_dense() for p in ins)
        tol = 4e-3 if partial_sums == "wire" else 1e-6  # a few fp16 roundings of the sums
        np.testing.assert_allclose(got[0].to_dense(), exact, rtol=tol, atol=tol)


def test_partial_sums_setting_is_checked() -> None:
    with pytest.raises(ConfigError):
        RoundConfig(partial_sums="fp8")


# --------------------------------------------------------------------------------------------------------
# all-pairs: the message pattern, bit-reproducible sums in core order, who may send what
# --------------------------------------------------------------------------------------------------------
def _random_payload(rng: np.random.Generator, layer: int) -> SparsePayload:
    """Values whose fp32 sums depend on the order they are added in (unlike make_payload's integers)."""
    dense_len, bs = layer_shape(layer)
    nb = -(-dense_len // bs)
    idx = np.flatnonzero(rng.random(nb) < 0.6).astype(np.int64)
    dense = (rng.standard_normal(dense_len) * 10.0 ** rng.integers(-4, 4, dense_len)).astype(np.float32)
    return SparsePayload.from_dense_blocks(layer, dense, idx, bs)


def _allpairs_round(seed: int) -> tuple[Net, list[tuple[str, Send]], dict[str, SparsePayload]]:
    net = Net(SITES, PlanSpec.make("allpairs"), RoundConfig())
    sent: list[tuple[str, Send]] = []
    net.listeners.append(lambda site, a: sent.append((site, a)) if isinstance(a, Send) else None)
    rng = np.random.default_rng(seed)
    pushed = {s: _random_payload(rng, 3) for s in SITES}
    for s in SITES:
        net.push(s, 0, 3, pushed[s])
    net.run()
    return net, sent, pushed


def test_allpairs_sends_two_messages_to_every_peer_per_round() -> None:
    net, sent, _ = _allpairs_round(1)
    assert not net.errors
    n = len(SITES)
    for s in SITES:
        mine = [a for site, a in sent if site == s]
        assert len(mine) == 2 * (n - 1)
        for peer in SITES:
            if peer == s:
                continue
            kinds = sorted(a.kind for a in mine if a.peer == peer)
            assert kinds == ["segment", "segment_final"]
            (part,) = [a for a in mine if a.peer == peer and a.kind == "segment"]
            (fin,) = [a for a in mine if a.peer == peer and a.kind == "segment_final"]
            assert part.msg.segment == SITES.index(peer) and fin.msg.segment == SITES.index(s)
    # 2 message latencies per round (10 ms links): a part, then a finished segment
    assert max(net.delivered_at[s][(0, 3)] for s in SITES) < 0.025


def test_allpairs_sums_in_core_order_bit_for_bit_and_reproducibly() -> None:
    net, _, pushed = _allpairs_round(7)
    again, _, _ = _allpairs_round(7)
    results = [n.delivered[s][(0, 3)].payload for n in (net, again) for s in SITES]
    assert all(p is not None for p in results)
    assert len({p.values.tobytes() + p.indices.tobytes() for p in results if p is not None}) == 1
    ref = np.zeros(layer_shape(3)[0], np.float32)
    for s in SITES:  # core order a, b, c, d, one fp32 rounding per addition
        ref = ref + pushed[s].to_dense()
    got = results[0]
    assert got is not None and got.to_dense().tobytes() == ref.tobytes()
    assert net.delivered["a"][(0, 3)].sites == tuple((s, 0) for s in SITES)


def test_allpairs_rejects_misplaced_parts_and_foreign_finals() -> None:
    spec = PlanSpec.make("allpairs", stragglers=["d"])  # core a, b, c; d is a's child
    e = RoundEngine("b", SITES, spec, RoundConfig())
    pid = e.plan_for(0).plan_id
    e.local_push(0, 0, make_payload("b", 0, 0), now=0.0)
    dense_len, bs = layer_shape(0)  # 3 blocks: segment g of 3 is block g
    block = lambda g: SparsePayload.from_dense_blocks(0, np.ones(dense_len, np.float32), np.array([g]), bs)  # noqa: E731
    with pytest.raises(RemoteProtocolError):  # b owns segment 1, not 0
        e.peer_message("a", RoundMsg("segment", 0, 0, pid, block(0), (("a", 0),), 0, 0), now=0.0)
    with pytest.raises(MalformedPayload):  # a part of segment 1 holding a block of segment 2
        e.peer_message("a", RoundMsg("segment", 0, 0, pid, block(2), (("a", 0),), 0, 1), now=0.0)
    with pytest.raises(RemoteProtocolError):  # d is not in the core
        e.peer_message("d", RoundMsg("segment", 0, 0, pid, block(1), (("d", 0),), 0, 1), now=0.0)
    with pytest.raises(RemoteProtocolError):  # segment 2's result comes only from its owner c
        e.peer_message("a", RoundMsg("segment_final", 0, 0, pid, block(2), (("a", 0),), 0, 2), now=0.0)
    e.peer_message("a", RoundMsg("segment", 0, 0, pid, block(1), (("a", 0),), 0, 1), now=0.0)
    with pytest.raises(RemoteProtocolError):  # one part per member and round
        e.peer_message("a", RoundMsg("segment", 0, 0, pid, block(1), (("a", 0),), 0, 1), now=0.0)
    out = e.peer_message("c", RoundMsg("segment", 0, 0, pid, block(1), (("c", 0),), 0, 1), now=0.0)
    fins = [a for a in out if isinstance(a, Send)]
    assert sorted(a.peer for a in fins) == ["a", "c"] and {a.kind for a in fins} == {"segment_final"}
    assert fins[0].sites == (("a", 0), ("b", 0), ("c", 0))


def test_allpairs_member_suspects_whoever_it_still_waits_for() -> None:
    e = _engine("b", "allpairs", suspect_after_s=2.0)
    out = e.local_push(0, 0, make_payload("b", 0, 0), now=0.0)
    assert sorted((a.peer, a.kind) for a in out if isinstance(a, Send)) == [
        ("a", "segment"),
        ("c", "segment"),
        ("d", "segment"),
    ]
    sus = [a for a in e.tick(2.0) if isinstance(a, PeerSuspect)]
    assert [(s.peer, s.reason) for s in sus] == [("a", "ring")]
    assert e.tick(10.0) == []


def test_allpairs_with_a_straggler_child_accounts_everything() -> None:
    compute = {"a": 0.05, "b": 0.05, "c": 0.05, "d": 0.4}
    cfg = RoundConfig(round_deadline_s=1.0, t_w_s=0.02)
    net = Net(SITES, PlanSpec.make("allpairs", stragglers=["d"]), cfg)
    _run(net, 40, 3, compute=compute)
    assert not net.errors
    finals = assert_accounted(net)
    assert any(s == "d" for s, _, _ in _folded(finals))  # folded into later rounds, not waited for
    assert max(c.duration for c in net.closed["b"] if c.iteration < 40) < 0.4


# --------------------------------------------------------------------------------------------------------
# all-pairs direct rounds: sparse contributions go whole to every member, one hop, same bytes everywhere
# --------------------------------------------------------------------------------------------------------
def _sparse_payload(site: str, iteration: int, layer: int, dense: bool = False) -> SparsePayload:
    """1/12 of the layer's blocks (4 sites: 4 * 3 * nnz <= n_blocks, so direct), or every block."""
    dense_len, bs = layer_shape(layer)
    nb = -(-dense_len // bs)
    rng = np.random.default_rng([ord(site), iteration, layer])
    idx = np.arange(nb) if dense else np.sort(rng.choice(nb, size=nb // 12, replace=False))
    values = rng.integers(-4, 5, size=dense_len).astype(np.float32)
    return SparsePayload.from_dense_blocks(layer, values, idx.astype(np.int64), bs)


@pytest.mark.parametrize("policy", ["exact", "cap"])
def test_allpairs_direct_rounds_take_one_hop_and_account_everything(policy: str) -> None:
    cfg = RoundConfig(forward_policy=policy, forward_density=0.02)  # type: ignore[arg-type]
    net = Net(SITES, PlanSpec.make("allpairs"), cfg)
    sent: list[tuple[str, Send]] = []
    net.listeners.append(lambda site, a: sent.append((site, a)) if isinstance(a, Send) else None)
    _run(net, 30, 9, payload=_sparse_payload)
    assert not net.errors
    finals = assert_accounted(net)  # with "cap", every residual is held exactly once
    assert len(finals) == 270 and all(len(d.sites) == 4 for d in finals.values())
    if policy == "exact":
        assert {a.kind for _, a in sent} == {"segment"} and {a.msg.segment for _, a in sent} == {-1}
        for s in SITES:  # N - 1 messages per member and round, one to every peer
            assert len([a for site, a in sent if site == s]) == 3 * 270
    else:  # a held residual joins the next contribution; rounds that grow too dense take two hops
        assert any(a.msg.segment == -1 for _, a in sent)
        assert any(p is not None and p.nnz_blocks for e in net.engines.values() for p, _ in e.held(8))


def test_allpairs_direct_result_is_the_two_hop_result_bit_for_bit() -> None:
    results = []
    for direct in (True, False):
        net = Net(SITES, PlanSpec.make("allpairs"), RoundConfig(allpairs_direct=direct))
        rng = np.random.default_rng(3)
        for s in SITES:
            p = _sparse_payload(s, 0, 8)
            vals = (rng.standard_normal(p.nnz) * 10.0 ** rng.integers(-4, 4, p.nnz)).astype(np.float32)
            net.push(s, 0, 8, SparsePayload(8, p.dense_len, p.block_size, p.indices, vals))
        net.run()
        assert not net.errors
        got = [net.delivered[s][(0, 8)].payload for s in SITES]
        assert len({q.values.tobytes() + q.indices.tobytes() for q in got if q is not None}) == 1
        results.append(got[0])
    assert results[0] is not None and results[1] is not None
    assert results[0].values.tobytes() == results[1].values.tobytes()


def test_allpairs_one_dense_member_makes_the_round_two_hop() -> None:
    net = Net(SITES, PlanSpec.make("allpairs"), RoundConfig())
    sent: list[tuple[str, Send]] = []
    net.listeners.append(lambda site, a: sent.append((site, a)) if isinstance(a, Send) else None)
    pushed = {s: _sparse_payload(s, 0, 8, dense=s == "c") for s in SITES}
    for s in SITES:
        net.push(s, 0, 8, pushed[s])
    net.run()
    assert not net.errors
    assert_accounted(net)
    whole = {site for site, a in sent if a.kind == "segment" and a.msg.segment == -1}
    assert whole == {"a", "b", "d"}  # c cut its dense contribution; the others sent theirs whole
    assert {site for site, a in sent if a.kind == "segment_final"} == set(SITES)  # so: all-gather
    exact = sum(p.to_dense() for p in pushed.values())
    got = net.delivered["a"][(0, 8)].payload
    assert got is not None
    np.testing.assert_array_equal(got.to_dense(), exact)


def test_allpairs_whole_part_must_be_well_formed() -> None:
    e = _engine("b", "allpairs")
    pid = e.plan_for(0).plan_id
    p = _sparse_payload("a", 0, 8)
    e.local_push(0, 8, _sparse_payload("b", 0, 8), now=0.0)
    with pytest.raises(RemoteProtocolError):
        e.peer_message("a", RoundMsg("segment", 0, 8, pid, p, (("a", 0),), 1, -1), now=0.0)
    assert e.peer_message("a", RoundMsg("segment", 0, 8, pid, p, (("a", 0),), 0, -1), now=0.0) == []


def test_may_be_behind_only_when_cut_off_and_the_others_have_a_quorum() -> None:
    """The join bound (PeerAdmission._check_claims) believes a peer far ahead only when the job could have
    gone on without this site: with 2 sites never (a majority of 2 needs both), with 3 only once both others
    are lost here."""
    two = RoundEngine("a", ["a", "b"])
    two.peer_lost("b", 0.0)
    assert not two.may_be_behind()
    three = RoundEngine("a", ["a", "b", "c"])
    assert not three.may_be_behind()
    three.peer_lost("b", 0.0)
    assert not three.may_be_behind()  # a and c still make a majority: nothing finished without a
    three.peer_lost("c", 0.0)
    assert three.may_be_behind()


def test_a_result_only_a_killed_gateway_made_is_settled_by_the_survivor() -> None:
    """Gateway a has its own push and b's for round 0 and makes the result, then dies before its own
    contribution leaves for b. b never has round 0: once a fresh a rejoins at 5, b settles round 0 without
    a and carries its own push 0 into round 5. So b's push 0 is in two results, a's dead one and round 5;
    only round 5 is in any site's parameters (a's trainer resyncs; RoundEngine.fresh_peer_joined). The
    real-client soak's accounting leaves such orphan results out (tools.chaos_real.account)."""
    spec = PlanSpec.make("allpairs")
    rc = RoundConfig(round_deadline_s=1.0)
    engines = {s: RoundEngine(s, ("a", "b"), spec, rc, start_iteration=0) for s in "ab"}
    delivered: dict[str, list[Deliver]] = {"a": [], "b": []}

    def run(site: str, acts: list[Any], *, lose_sends: bool = False) -> None:
        """Carry out ``site``'s actions: deliveries recorded, sends handed to the peer (or lost)."""
        for x in acts:
            if isinstance(x, Deliver):
                delivered[site].append(x)
            elif isinstance(x, Send) and not lose_sends:
                run(x.peer, engines[x.peer].peer_message(site, x.msg, 0.0))

    run("a", engines["a"].local_push(0, 0, make_payload("a", 0, 0), 0.0), lose_sends=True)  # dies with it
    run("b", engines["b"].local_push(0, 0, make_payload("b", 0, 0), 0.0))
    assert [(d.iteration, d.sites) for d in delivered["a"]] == [(0, (("a", 0), ("b", 0)))]
    assert delivered["b"] == []
    join = 5
    b = engines["b"]
    b.peer_lost("a", 5.0)
    engines["a"] = RoundEngine("a", ("a", "b"), spec, rc, start_iteration=join)  # the fresh gateway
    run("b", b.peer_joined("a", 6.0, join) + b.fresh_peer_joined("a", join, 6.0))
    for it in range(1, join + 1):
        run("b", b.local_push(it, 0, make_payload("b", it, 0), 7.0))
    run("a", engines["a"].local_push(join, 0, make_payload("a", join, 0), 7.0))
    assert [d.iteration for d in delivered["b"]] == [join]  # round 0 settled at b without a result
    for site in "ab":
        assert ("b", 0) in delivered[site][-1].sites and delivered[site][-1].iteration == join
