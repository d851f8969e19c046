"""Parameter resync at node level: real :class:`GatewayNode` s, the real handshake, no sockets or loop.

A gateway restarted from a state file far behind the job tells its trainer to fetch the parameters; the
question travels to a running peer, whose trainer answers; the answer comes back checked. A peer that
breaks the rules (an announce bigger than the job's model, a chunk out of its range, NaN values, a question
from a site that is not a member) loses its link.
"""

from __future__ import annotations

import numpy as np
import pytest

from gateways.config import GatewayConfig
from gateways.node import CloseLink, GatewayNode, ToTrainer
from tests.gateways.node.node_mesh import SECRET, NodeMesh
from wanrt.client.link.param_resync import SnapshotReceiver, snapshot_frames
from wanrt.client.link.signature import LayerSignature
from wanrt.errors import MalformedPayload, RemoteProtocolError
from wanrt.payload import SparsePayload
from wanrt.protocol import (
    Message,
    Notice,
    ParamAnnounce,
    ParamChunk,
    ParamRefuse,
    ParamRequest,
    Push,
)

SITES = "abc"
LENGTHS = (37, 0, 300)  # an empty layer too: the cursor must step over it


def _signature() -> dict[str, object]:
    names = [f"l{i}" for i in range(len(LENGTHS))]
    return LayerSignature.of(names, [(n,) for n in LENGTHS], ["float32"] * len(LENGTHS)).info()


def _node(site: str, *, resume: int = -1) -> GatewayNode:
    peers = {p: f"tcp://127.0.0.1:{9000 + ord(p)}" for p in SITES if p != site}
    node = GatewayNode(GatewayConfig(site=site, job="j", secret=SECRET, peers=peers), 0.0)
    node.resume_frontier = resume
    node.start(0.0)
    assert node.trainer_model_problem(_signature()) is None
    node.trainer_connected(1)
    return node


def _running_at(site: str, frontier: int) -> GatewayNode:
    """A survivor that ran the job up to ``frontier`` and lost the other sites meanwhile."""
    node = _node(site)
    node._create_engine(frontier, set(SITES), 0.0)
    for peer in SITES:
        if peer != site:
            node.declare_lost(peer, "its gateway was killed", 0.0)
    return node


class _Mesh(NodeMesh):
    """Nodes joined by in-memory links; records what each node sends its trainer and which links it ends."""

    def __init__(self, nodes: dict[str, GatewayNode]) -> None:
        super().__init__(nodes, now=0.1)
        self.closed: dict[str, list[CloseLink]] = {s: [] for s in nodes}

    def on_action(self, site: str, action: object) -> bool:
        if not isinstance(action, CloseLink):
            return super().on_action(site, action)
        self.closed[site].append(action)
        for key, lid in list(self.links.items()):
            if key[0] == site and lid == action.link_id:
                del self.links[key]
        return True

    def trainer_sends(self, site: str, msg: Message) -> None:
        self.nodes[site].trainer_params(1, msg, self.now)
        self.pump()

    def forge(self, site: str, peer: str, msg: Message) -> None:
        """``site``'s gateway sends ``msg`` to ``peer`` as a peer breaking the rules would."""
        ch = self.nodes[site].mesh.by_peer[peer]
        ch.send_control(msg)
        self.pump()

    def last(self, site: str, kind: type) -> list:
        return [m for m in self.to_trainer[site] if isinstance(m, kind)]


def _restarted_c() -> tuple[_Mesh, int]:
    """c's gateway restarted from a state file at 10 while the job ran on to 40; it links to a."""
    mesh = _Mesh({"a": _running_at("a", 40), "c": _node("c", resume=10)})
    mesh.link("a", "c")
    c = mesh.nodes["c"]
    assert c.join_at is not None and c.join_at > 11
    return mesh, c.join_at


def _layers(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(n).astype(np.float32) for n in LENGTHS]


def test_a_restarted_gateway_s_trainer_gets_the_parameters_of_a_running_site() -> None:
    mesh, j = _restarted_c()
    notices = [n for n in mesh.last("c", Notice) if n.kind == "resync"]
    assert [n.info["iteration"] for n in notices] == [j]  # told once, with J
    receiver = SnapshotReceiver(LENGTHS)
    request = receiver.on_notice(notices[0])
    assert request is not None and request.lengths == LENGTHS
    mesh.trainer_sends("c", request)
    asked = mesh.last("a", ParamRequest)  # a's gateway hands the question to its own trainer
    assert len(asked) == 1 and asked[0].iteration == j and asked[0].lengths == ()
    served = _layers(1)
    for frame in snapshot_frames(asked[0].request, j + 2, [(j + 2, 0)], served, chunk=64):
        mesh.trainer_sends("a", frame)
    got = None
    for m in mesh.to_trainer["c"]:
        if isinstance(m, ParamAnnounce):
            assert m.request == request.request and m.iteration == j + 2 and m.extras == ((j + 2, 0),)
            receiver.on_announce(m)
        elif isinstance(m, ParamChunk):
            got = receiver.on_chunk(m) or got
    assert got is not None and got.iteration == j + 2 and not got.wants(j + 2, 0) and got.wants(j + 2, 2)
    for mine, theirs in zip(got.layers, served, strict=True):
        np.testing.assert_array_equal(mine, theirs)
    c = mesh.nodes["c"]
    assert c.resync.need is None and c.status()["resync"]["completed"] == 1
    assert mesh.nodes["a"].resync.stats.served == 1 and not mesh.nodes["a"].resync._serving
    assert not mesh.closed["a"] and not mesh.closed["c"]
    c.trainer_connected(2)  # done: a reconnecting trainer is not told again
    assert not any(
        isinstance(a.msg, Notice) and a.msg.kind == "resync"
        for a in c.pop_actions()
        if isinstance(a, ToTrainer)
    )


def test_a_site_without_a_trainer_refuses_and_the_question_waits_for_another_site() -> None:
    mesh, j = _restarted_c()
    a = mesh.nodes["a"]
    a.trainer_disconnected(1, "gone")
    mesh.trainer_sends("c", ParamRequest(5, j, LENGTHS))
    c = mesh.nodes["c"]
    assert c.resync.stats.refused == 1 and c.resync.need == j and c.resync.retry_at is not None
    a.trainer_connected(3)
    mesh.now = c.resync.retry_at + 0.01
    c.tick(mesh.now)  # asks again (a now has a trainer)
    mesh.pump()
    assert len(mesh.last("a", ParamRequest)) == 1


def test_the_trainer_must_describe_the_job_s_model() -> None:
    mesh, j = _restarted_c()
    with pytest.raises(RemoteProtocolError, match="describes 2 layers"):
        mesh.nodes["c"].trainer_params(1, ParamRequest(5, j, (37, 0)), mesh.now)


def _asked(mesh: _Mesh, j: int) -> int:
    """c's trainer asked; returns the id a's gateway gave the question on the a–c link."""
    mesh.trainer_sends("c", ParamRequest(5, j, LENGTHS))
    rid = next(iter(mesh.nodes["c"].resync._asks))
    return rid


def _link_ended(mesh: _Mesh, match: str) -> None:
    assert mesh.links.get(("c", "a")) is None, "the link stayed up"
    errors = [cl.error for cl in mesh.closed["c"]]
    assert errors and isinstance(errors[0], RemoteProtocolError) and match in str(errors[0])


def test_an_announce_bigger_than_the_job_s_model_ends_the_link() -> None:
    mesh, j = _restarted_c()
    rid = _asked(mesh, j)
    mesh.forge("a", "c", ParamAnnounce(rid, j, (37, 0, 1 << 30)))
    _link_ended(mesh, "announces parameters")
    assert not mesh.last("c", ParamAnnounce)  # never reached the trainer, which allocated nothing


def test_a_chunk_out_of_its_range_ends_the_link() -> None:
    mesh, j = _restarted_c()
    rid = _asked(mesh, j)
    mesh.forge("a", "c", ParamAnnounce(rid, j, LENGTHS))
    mesh.forge("a", "c", ParamChunk(rid, 0, 0, np.zeros(30, np.float32)))  # fine: [0, 30) of layer 0
    mesh.forge("a", "c", ParamChunk(rid, 0, 30, np.zeros(8, np.float32)))  # 38 > 37
    _link_ended(mesh, "runs past layer 0")
    assert len(mesh.last("c", ParamChunk)) == 1


def test_a_chunk_not_next_in_order_ends_the_link() -> None:
    mesh, j = _restarted_c()
    rid = _asked(mesh, j)
    mesh.forge("a", "c", ParamAnnounce(rid, j, LENGTHS))
    mesh.forge("a", "c", ParamChunk(rid, 2, 0, np.zeros(8, np.float32)))  # layer 0 comes first
    _link_ended(mesh, "expected layer 0 at 0")


def test_a_nan_chunk_ends_the_link() -> None:
    mesh, j = _restarted_c()
    rid = _asked(mesh, j)
    mesh.forge("a", "c", ParamAnnounce(rid, j, LENGTHS))
    bad = np.zeros(37, np.float32)
    bad[3] = np.nan
    mesh.forge("a", "c", ParamChunk(rid, 0, 0, bad))
    assert mesh.links.get(("c", "a")) is None
    assert isinstance(mesh.closed["c"][0].error, MalformedPayload)
    assert not mesh.last("c", ParamChunk)


def test_an_answer_to_a_question_never_asked_ends_the_link() -> None:
    mesh, j = _restarted_c()
    mesh.forge("a", "c", ParamAnnounce(99, j, LENGTHS))
    _link_ended(mesh, "never sent")


def test_a_question_from_a_site_that_is_not_a_member_is_refused() -> None:
    mesh, j = _restarted_c()
    a, c = mesh.nodes["a"], mesh.nodes["c"]
    assert a.engine is not None
    a.engine.peer_lost("c", mesh.now)  # a counts c out (its link is still up)
    mesh.trainer_sends("c", ParamRequest(5, j, LENGTHS))
    assert not mesh.last("a", ParamRequest)  # a's trainer was never asked
    assert a.resync.stats.refused_non_member == 1 and c.resync.stats.refused == 1
    assert c.resync.need == j  # still owed: asked again later


def test_a_question_far_past_the_frontier_ends_the_link() -> None:
    mesh, _ = _restarted_c()
    mesh.forge("c", "a", ParamRequest(1, 10_000))
    error = mesh.closed["a"][0].error
    assert isinstance(error, RemoteProtocolError) and "at most" in str(error)


def test_the_serving_trainer_must_send_finite_values() -> None:
    mesh, j = _restarted_c()
    _asked(mesh, j)
    lid = mesh.last("a", ParamRequest)[0].request
    bad = np.full(37, np.inf, np.float32)
    with pytest.raises(MalformedPayload):
        mesh.nodes["a"].trainer_params(1, ParamChunk(lid, 0, 0, bad), mesh.now)


def test_the_link_going_down_mid_transfer_tells_the_trainer_to_start_over() -> None:
    mesh, j = _restarted_c()
    _asked(mesh, j)
    lid = mesh.last("a", ParamRequest)[0].request
    mesh.trainer_sends("a", ParamAnnounce(lid, j, LENGTHS))
    c = mesh.nodes["c"]
    c.link_closed(mesh.links.pop(("c", "a")), "connection reset", mesh.now)
    mesh.pump()
    refusals = mesh.last("c", ParamRefuse)
    assert refusals and refusals[-1].request == 5 and c.resync.need == j  # still owed


def test_a_site_whose_held_rounds_were_settled_is_told_past_every_iteration_it_saw() -> None:
    """Cut off from the job, its rounds settled without results when it came back: the real results of
    those rounds must be in the snapshot, so J is past every iteration this site saw."""
    mesh = _Mesh({s: _node(s) for s in SITES})
    for x, y in (("a", "b"), ("a", "c"), ("b", "c")):
        mesh.link(x, y)
    for x, y in (("a", "b"), ("a", "c")):
        for u, v in ((x, y), (y, x)):
            mesh.nodes[u].link_closed(mesh.links.pop((u, v)), "connection reset", mesh.now)
    mesh.pump()
    payload = SparsePayload.from_dense_blocks(0, np.ones(64, np.float32), np.arange(2), 16)
    for it in range(12):
        for s in "abc" if it < 3 else "bc":
            mesh.nodes[s].trainer_push(1, Push("j", it, 0, 0, s, payload), mesh.now)
            mesh.pump()
    a = mesh.nodes["a"]
    assert a.resync.need is None
    mesh.link("a", "b")  # back, far behind: its held rounds 0..2 are settled without results here
    assert a.engine is not None and a.engine.stats.settled > 0
    notices = [n for n in mesh.last("a", Notice) if n.kind == "resync"]
    assert len(notices) == 1 and notices[0].info["iteration"] == a.engine.frontier + 1 > 2


STATE = (37, 37, 3, 0, 0, 0, 300, 300, 19)  # Adam's arrays per layer (block size 16)


def _state(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.floor(rng.uniform(0, 9, n)).astype(np.float32) for n in STATE]


@pytest.mark.parametrize("serves_state", [True, False], ids=["with state", "parameters alone"])
def test_the_optimizer_state_travels_with_the_parameters_or_is_left_out(serves_state: bool) -> None:
    mesh, j = _restarted_c()
    notice = next(n for n in mesh.last("c", Notice) if n.kind == "resync")
    receiver = SnapshotReceiver(LENGTHS, STATE)
    request = receiver.on_notice(notice)
    assert request is not None and request.lengths == LENGTHS + STATE and request.state == len(STATE)
    mesh.trainer_sends("c", request)
    asked = mesh.last("a", ParamRequest)
    assert len(asked) == 1 and asked[0].state == len(STATE)  # the serving trainer knows what fits
    served, state = _layers(2), _state(3)
    sent = state if serves_state else []
    for frame in snapshot_frames(asked[0].request, j, [], served, chunk=64, state=sent):
        mesh.trainer_sends("a", frame)
    got = None
    for m in mesh.to_trainer["c"]:
        if isinstance(m, ParamAnnounce):
            receiver.on_announce(m)
        elif isinstance(m, ParamChunk):
            got = receiver.on_chunk(m) or got
    assert got is not None and not mesh.closed["c"]
    assert [a.tolist() for a in got.layers] == [a.tolist() for a in served]
    assert [a.tolist() for a in got.state] == ([a.tolist() for a in state] if serves_state else [])


def test_a_resync_request_must_describe_the_job_s_layers_before_its_state() -> None:
    mesh, _ = _restarted_c()
    notice = next(n for n in mesh.last("c", Notice) if n.kind == "resync")
    request = SnapshotReceiver(LENGTHS, STATE).on_notice(notice)
    assert request is not None
    lying = ParamRequest(request.request, request.iteration, request.lengths, len(STATE) - 1)
    with pytest.raises(RemoteProtocolError, match="describes 4 layers"):
        mesh.trainer_sends("c", lying)


def test_an_announce_with_state_the_asker_cannot_take_ends_the_link() -> None:
    mesh, j = _restarted_c()
    notice = next(n for n in mesh.last("c", Notice) if n.kind == "resync")
    request = SnapshotReceiver(LENGTHS, STATE).on_notice(notice)
    assert request is not None
    mesh.trainer_sends("c", request)
    rid = max(mesh.nodes["c"].resync._asks)
    # another optimizer's arrays (two per layer): neither the asked state nor the parameters alone
    other = (37, 37, 0, 0, 300, 300)
    mesh.forge("a", "c", ParamAnnounce(rid, j, LENGTHS + other, state=len(other), checksum=bytes(16)))
    assert mesh.closed["c"] and "announces parameters" in mesh.closed["c"][0].reason
