"""Where a (re)joining gateway takes its place: from a running peer, never behind the job (chaos soak).

Node level: real :class:`GatewayNode` s, linked with the real handshake (as :mod:`sims.des.world` does),
no sockets or loop.
"""

from __future__ import annotations

import numpy as np
import pytest

from gateways.config import GatewayConfig
from gateways.membership.joining import LinkInfo, join_iteration
from gateways.node import GatewayNode, ToTrainer
from tests.gateways.node.node_mesh import SECRET, NodeMesh, link_nodes
from wanrt.errors import RemoteProtocolError
from wanrt.payload import SparsePayload
from wanrt.protocol import Ack, Aggregate, Notice, Push

SITES = "abc"
LOST_AFTER = 5.0 * 3  # the default heartbeat_interval × heartbeat_misses


def _node(site: str, *, resume: int = -1) -> GatewayNode:
    peers = {p: f"tcp://127.0.0.1:{9000 + ord(p)}" for p in SITES if p != site}
    node = GatewayNode(GatewayConfig(site=site, job="j", secret=SECRET, peers=peers), 0.0)
    node.resume_frontier = resume  # what the daemon reads from its state file before start()
    node.start(0.0)
    return node


def _link(na: GatewayNode, nb: GatewayNode, now: float) -> None:
    """The real handshake (``na`` dials), then ``link_up`` on both sides; a refusal raises."""
    link_nodes(na, nb, now)


def _running_at(site: str, frontier: int) -> GatewayNode:
    """A survivor that has run the job up to ``frontier``."""
    node = _node(site)
    node._create_engine(frontier, set(SITES), 0.0)
    for peer in SITES:
        if peer != site:
            node.declare_lost(peer, "its gateway was killed", 0.0)
    assert node.engine is not None and node.engine.frontier == frontier - 1
    return node


def test_two_restarted_gateways_take_their_place_from_a_running_peer() -> None:
    a, b = _node("a", resume=10), _node("b", resume=10)  # restarted together, state files at 10
    c = _running_at("c", 40)  # the job ran on meanwhile
    with pytest.raises(RemoteProtocolError, match="waiting for a running gateway"):
        _link(a, b, 0.1)  # they reach each other first: not a job of their own at 10 + 1 + window
    assert not a.joined and not b.joined
    _link(a, c, 0.2)
    _link(b, a, 0.3)  # b joins from a, now running
    # both past the job's frontier (39), each where every peer counts it in from
    assert a.join_at == 39 + 1 + 3 and b.join_at == 42 + 1 + 3
    assert c.engine is not None and a.engine is not None
    assert c.engine.plan_for(44).members == a.engine.plan_for(44).members == ("a", "c")  # b from 46
    _link(b, c, 0.4)
    assert c.engine.plan_for(46).members == a.engine.plan_for(46).members == ("a", "b", "c")


def test_fresh_gateways_start_together_when_no_running_peer_links_in_time() -> None:
    a, b = _node("a", resume=10), _node("b", resume=10)  # the whole job restarted
    with pytest.raises(RemoteProtocolError):
        _link(a, b, 1.0)
    _link(a, b, LOST_AFTER + 0.1)  # nobody running answered within the time a silent peer is lost
    assert a.join_at == b.join_at == 10 + 1 + 3


def test_a_cold_start_is_never_held_up() -> None:
    a, b = _node("a"), _node("b")
    _link(a, b, 0.1)
    assert a.join_at == b.join_at == 0


def test_running_gateways_that_lost_each_other_take_each_other_back_from_their_oldest_open_round() -> None:
    d, f = LinkInfo(12, False, low=10), LinkInfo(13, False, low=11)
    assert join_iteration(d, f, margin=3) == join_iteration(f, d, margin=3) == 10  # both ends alike
    # never past the rule for a fresh gateway, whatever a peer claims
    assert join_iteration(LinkInfo(12, False, low=13), LinkInfo(12, False, low=900), margin=3) == 13
    assert join_iteration(LinkInfo(12, False, low=90), LinkInfo(12, False, low=900), margin=3) == 16
    # one far behind the other (cut off from the job, whose old results are pruned) rejoins past both
    assert join_iteration(LinkInfo(20, False, low=19), LinkInfo(42, False, low=40), margin=3) == 46
    # behind: an oldest open round more than a window behind the newest frontier (its result may be pruned)
    ahead, behind = LinkInfo(30, False, low=29), LinkInfo(29, False, low=26)
    assert join_iteration(ahead, behind, margin=3) == 34
    assert join_iteration(ahead, behind, margin=3, retained=4) == 26
    # a fresh gateway (no rounds) still joins past every frontier; a claimed join_at still wins
    assert join_iteration(LinkInfo(-1, True), LinkInfo(41, False, low=30), margin=3) == 45
    assert join_iteration(LinkInfo(60, False, low=58), LinkInfo(46, False, 45, low=44), margin=3) == 45


def test_low_travels_in_the_handshake_and_is_checked() -> None:
    info = LinkInfo(5, False, None, ("a", "b"), low=4).to_info()
    assert LinkInfo.parse(info, peer="x").low == 4
    for bad in (-1, "4", 2**70):
        with pytest.raises(RemoteProtocolError, match="low"):
            LinkInfo.parse({**info, "low": bad}, peer="x")


def test_a_running_node_announces_its_oldest_unfinished_iteration() -> None:
    c = _running_at("c", 40)
    assert LinkInfo.parse(c.link_info("a"), peer="c").low == 40


# ---------------------------------------------------------------------------------------------------------
# a site cut off from the job catches up instead of waiting forever, and its trainer is told
# ---------------------------------------------------------------------------------------------------------
class _Mesh(NodeMesh):
    """Nodes joined by in-memory links: bytes a node writes are handed to the other end at once."""

    def cut(self, a: str, b: str) -> None:
        for x, y in ((a, b), (b, a)):
            self.nodes[x].link_closed(self.links.pop((x, y)), "connection reset", self.now)
        self.pump()


def test_a_site_cut_off_from_the_job_catches_up_and_its_trainer_is_told() -> None:
    mesh = _Mesh({s: _node(s) for s in SITES})
    for a, b in (("a", "b"), ("a", "c"), ("b", "c")):
        mesh.link(a, b)
    for node in mesh.nodes.values():
        node.trainer_connected(1)
    mesh.cut("a", "b")
    mesh.cut("a", "c")  # a is alone: no quorum, it holds its rounds
    for it in range(3):
        mesh.push("a", it)
    for it in range(12):  # b and c (a majority) train on
        mesh.push("b", it)
        mesh.push("c", it)
    a = mesh.nodes["a"]
    assert a.engine is not None and sorted(a.engine.open_rounds()) == [(0, 0), (1, 0), (2, 0)]
    mesh.link("a", "b")  # back, far behind the job: it rejoins at the job's frontier
    assert not a.engine.open_rounds()  # its held rounds were settled: nothing waits forever
    answered = {(m.iteration, m.payload.nnz) for m in mesh.to_trainer["a"] if isinstance(m, Aggregate)}
    assert {(0, 0), (1, 0), (2, 0)} <= answered  # empty aggregates: the trainer goes on
    notices = [m for m in mesh.to_trainer["a"] if isinstance(m, Notice)]
    assert any(n.kind == "trainer" and "fell behind the job" in n.message for n in notices)


def test_a_root_acks_its_trainer_s_push_only_once_a_peer_has_the_result() -> None:
    """A result made here exists nowhere else until a peer received it: a root killed in between would
    leave its trainer believing a push counted that the others re-ran the round without (soak: pushes
    lost with a killed root). The push ack waits for the peer's link-level Ack of the result."""
    mesh = _Mesh({s: _node(s) for s in SITES})
    for a, b in (("a", "b"), ("a", "c"), ("b", "c")):
        mesh.link(a, b)
    for node in mesh.nodes.values():
        node.trainer_connected(1)
    root = mesh.nodes["a"]
    assert root.engine is not None and root.engine.plan_for(0).parent_of("a") is None
    mesh.push("b", 0)
    mesh.push("c", 0)  # the children's partials are at the root, which waits for its own push
    payload = SparsePayload.from_dense_blocks(0, np.ones(64, np.float32), np.arange(2), 16)
    root.trainer_push(1, Push("j", 0, 0, 0, "a", payload), mesh.now)
    first = [a.msg for a in root.pop_actions() if isinstance(a, ToTrainer)]
    assert any(isinstance(m, Aggregate) and m.iteration == 0 for m in first)  # delivered here at once
    assert not any(isinstance(m, Ack) for m in first)  # but not yet acknowledged as counted
    mesh.pump()  # the children receive the result and acknowledge its frame
    assert any(isinstance(m, Ack) and (m.iteration, m.layer) == (0, 0) for m in mesh.to_trainer["a"])
    # a child's own push ack came with the result from its parent, at once
    assert any(isinstance(m, Ack) and m.iteration == 0 for m in mesh.to_trainer["b"])


def test_a_gateway_that_starts_late_takes_part_in_the_rounds_its_peers_count_it_in() -> None:
    """A cold start where one site's gateway comes up after the others' trainers pushed (bench_gateway's
    4-gateway tree under load): the running peers started with every configured site live and never lost
    it, so they do not re-plan it in at a later iteration. The late gateway must start in their open
    rounds, not past them, or every site waits for it until the round deadline."""
    mesh = _Mesh({s: _node(s) for s in SITES})
    mesh.link("a", "b")  # c is not up yet
    for node in (mesh.nodes["a"], mesh.nodes["b"]):
        node.trainer_connected(1)
    for it in range(2):  # staleness 1: two pushes in flight, waiting for c
        mesh.push("a", it)
        mesh.push("b", it)
    a, c = mesh.nodes["a"], mesh.nodes["c"]
    assert a.engine is not None and "c" in a.engine.live and a.engine.open_rounds()
    mesh.link("c", "a")
    mesh.link("c", "b")
    assert c.join_at == 0  # where a counts it in (its oldest open round), not frontier + 1 + window
    c.trainer_connected(1)
    for it in range(2):
        mesh.push("c", it)
    assert not a.engine.open_rounds() and c.engine is not None and not c.engine.open_rounds()
    got = {(m.iteration, m.payload.nnz) for m in mesh.to_trainer["c"] if isinstance(m, Aggregate)}
    assert {it for it, nnz in got if nnz > 0} == {0, 1}  # c's trainer got both results


# ---------------------------------------------------------------------------------------------------------
# a gateway let in by a running peer learns the joins that peer already agreed (chaos soak, kill2)
# ---------------------------------------------------------------------------------------------------------
FOUR = "abcd"


def _node4(site: str, *, resume: int = -1) -> GatewayNode:
    peers = {p: f"tcp://127.0.0.1:{9000 + ord(p)}" for p in FOUR if p != site}
    node = GatewayNode(GatewayConfig(site=site, job="j", secret=SECRET, peers=peers), 0.0)
    node.resume_frontier = resume
    node.start(0.0)
    return node


def _survivor4(site: str, start: int) -> GatewayNode:
    """A running gateway (frontier ``start - 1``) that lost a and c, which were killed together."""
    node = _node4(site)
    node._create_engine(start, set(FOUR), 0.0)
    for peer in "ac":
        node.declare_lost(peer, "its gateway was killed", 0.0)
    return node


def test_a_gateway_let_in_by_a_running_peer_leaves_out_sites_that_join_after_it() -> None:
    b, d = _survivor4("b", 41), _survivor4("d", 40)  # b has seen one iteration more than d
    a, c = _node4("a", resume=10), _node4("c", resume=10)
    _link(a, b, 0.1)  # a joins past b's frontier: 40 + 1 + 3
    _link(a, d, 0.2)  # and says so on its first link to d
    assert a.join_at == 44
    _link(c, d, 0.3)  # c is let in by d, whose frontier is lower: c starts before a does
    assert c.join_at == 43
    assert c.engine is not None and d.engine is not None
    for it in (43, 44, 45):
        # every iteration's plan at c is d's: a takes part from 44 on, at c as everywhere else
        assert c.engine.plan_for(it).members == d.engine.plan_for(it).members, it
        assert ("a" in c.engine.plan_for(it).members) == (it >= 44), it
    _link(a, c, 0.4)  # a's first link to c: nothing changes, a was already known to join at 44
    assert c.engine.plan_for(43).members == ("b", "c", "d")


def test_joins_travel_in_the_handshake_and_are_checked() -> None:
    info = LinkInfo(5, False, None, ("a", "b"), low=4, joins=(("a", 7), ("b", 9))).to_info()
    assert LinkInfo.parse(info, peer="x").joins == (("a", 7), ("b", 9))
    assert LinkInfo.parse(LinkInfo(5, False).to_info(), peer="x").joins == ()
    for bad in (7, "a", "a:", "a:-1", "a:x", f"a:{2**70}", ":3"):
        with pytest.raises(RemoteProtocolError, match="joins"):
            LinkInfo.parse({**info, "joins": bad}, peer="x")
