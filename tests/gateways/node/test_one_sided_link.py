"""A handshake only one end completed must not make that end declare the peer lost (start-up stall 2).

``bench_gateway --smoke`` part (d) stalled for the round deadline about once in 25 runs: g00 dialled g03
and brought the link up after sending its Auth, while g03, which had joined the job through another link
during the handshake, refused the same connection (the pre-join ``link_epoch`` rule). g00 declared g03
lost at once, re-planned its open rounds without it and took it back a moment later; no other site saw a
change, so the partials they had sent g00 under the four-site plan were never sent again and round 0
waited for its deadline. Node level: real :class:`GatewayNode` s and handshakes, no sockets or loop.
"""

from __future__ import annotations

from typing import Any

from gateways.config import GatewayConfig
from gateways.node import GatewayNode
from gateways.rounds.config import RoundConfig
from tests.gateways.node.node_mesh import SECRET, NodeMesh, handshake
from wanrt.errors import TransportError
from wanrt.protocol import Aggregate, Connection

SITES = "abcd"
LOST_AFTER = 5.0 * 3  # the default heartbeat_interval × heartbeat_misses


def _node(site: str, rounds: RoundConfig) -> GatewayNode:
    peers = {p: f"tcp://127.0.0.1:{9000 + ord(p)}" for p in SITES if p != site}
    node = GatewayNode(GatewayConfig(site=site, job="j", secret=SECRET, peers=peers, rounds=rounds), 0.0)
    node.start(0.0)
    return node


class _Mesh(NodeMesh):
    """The sites of SITES, whose handshakes may stop half-way (bytes for an end whose link is not up are
    lost, as on a connection the other end aborted)."""

    def __init__(self, rounds: RoundConfig | None = None) -> None:
        super().__init__({s: _node(s, rounds or RoundConfig()) for s in SITES})
        #: handshakes the dialer finished and the acceptor has not decided on yet
        self._pending: dict[tuple[str, str], tuple[Connection, dict[str, Any], dict[str, Any]]] = {}

    def link(self, a: str, b: str) -> None:
        """The whole handshake, ``a`` dialling; both ends bring the link up."""
        self.half_link(a, b)
        self.accept_pending(a, b)

    def half_link(self, a: str, b: str) -> None:
        """``a`` dials ``b``: Hello, Welcome, Auth; ``a`` brings its link up once its Auth is out, ``b``
        has not decided yet (:meth:`accept_pending` or :meth:`refuse_pending`)."""
        h = handshake(self.nodes[a], self.nodes[b])
        self._pending[(a, b)] = (h.acceptor, h.acceptor_sent, h.hello_info)
        self.links[(a, b)] = self.nodes[a].link_up(b, h.dialer, h.dialer_sent, h.welcome_info, self.now)
        self.pump()

    def accept_pending(self, a: str, b: str) -> None:
        cb, ours_b, theirs = self._pending.pop((a, b))
        self.links[(b, a)] = self.nodes[b].link_up(a, cb, ours_b, theirs, self.now)
        self.pump()

    def refuse_pending(self, a: str, b: str) -> None:
        """``b`` aborts the connection it never brought up (what peer_links does when another link came up
        during the handshake): ``a`` receives the Error frame, then the connection ends."""
        cb, _, _ = self._pending.pop((a, b))
        frame = cb.abort(TransportError("another link came up during this handshake; the dialer tries again"))
        link_id = self.links.pop((a, b))
        if frame:
            self.nodes[a].link_data(link_id, bytes(frame), self.now)
        self.nodes[a].link_closed(link_id, "connection closed by the peer", self.now)
        self.pump()

    def results(self, site: str) -> dict[int, tuple[str, ...]]:
        """iteration -> the sites counted in the (non-empty) result this site's trainer got."""
        return {
            m.iteration: tuple(sorted(m.sites))
            for m in self.to_trainer[site]
            if isinstance(m, Aggregate) and m.payload.nnz > 0
        }


def _start_with_a_one_sided_handshake() -> _Mesh:
    """a, b, c run the job (every configured site live, round 0 in flight); d starts late: a's dial to d
    is refused by d after a brought its link up, because d joined through b meanwhile."""
    mesh = _Mesh()
    for a, b in (("a", "b"), ("a", "c"), ("b", "c")):
        mesh.link(a, b)
    for s in SITES:
        mesh.nodes[s].trainer_connected(1)
    for s in "abc":
        mesh.push(s, 0)  # round 0 waits for d (live everywhere: started with every configured site)
    mesh.now = 0.5
    mesh.half_link("a", "d")
    mesh.link("b", "d")  # d joins the job through b while a's handshake is in progress
    mesh.refuse_pending("a", "d")
    return mesh


def test_a_link_the_peer_never_brought_up_does_not_make_it_lost() -> None:
    mesh = _start_with_a_one_sided_handshake()
    a = mesh.nodes["a"]
    assert a.engine is not None and "d" in a.engine.live  # nothing happened as far as the others know
    assert a.engine.plan_for(0).members == ("a", "b", "c", "d")
    mesh.now = 0.7
    mesh.link("a", "d")  # a's dial loop tries again, d now running
    mesh.link("c", "d")
    mesh.push("d", 0)
    for s in SITES:
        assert mesh.results(s).get(0) == ("a", "b", "c", "d"), (s, mesh.results(s))
    for s in SITES:
        engine = mesh.nodes[s].engine
        assert engine is not None and not engine.open_rounds(), (s, engine.open_rounds())


def test_what_went_out_on_the_refused_link_is_sent_again_on_the_next() -> None:
    """Round messages a sent on the link d refused never reached d: they wait for the next link (as for a
    member that has not linked yet), they are not dropped. Star: the root a sends d the result itself."""
    mesh = _Mesh(RoundConfig(topology="star"))
    for a, b in (("a", "b"), ("a", "c"), ("b", "c")):
        mesh.link(a, b)
    for s in SITES:
        mesh.nodes[s].trainer_connected(1)
    for s in "abc":
        mesh.push(s, 0)
    mesh.now = 0.5
    mesh.half_link("a", "d")
    mesh.link("b", "d")
    mesh.link("c", "d")
    mesh.now = 1.2  # past the round deadline: the root finishes round 0 with a quorum, without d
    a = mesh.nodes["a"]
    a.tick(mesh.now)
    mesh.pump()  # the result goes out to b, c and d (on the link d is about to refuse)
    assert mesh.results("b").get(0) == ("a", "b", "c")
    mesh.refuse_pending("a", "d")
    assert a.engine is not None and "d" in a.engine.live
    mesh.now = 1.4
    mesh.link("a", "d")
    assert mesh.results("d").get(0) == ("a", "b", "c")  # the result reached d on the next link


def test_a_peer_that_never_links_again_is_still_declared_lost_in_time() -> None:
    mesh = _start_with_a_one_sided_handshake()
    a = mesh.nodes["a"]
    assert a.engine is not None
    mesh.now = 0.5 + LOST_AFTER + 0.1
    a.tick(mesh.now)
    mesh.pump()
    assert "d" not in a.engine.live  # the no-link timeout decides, as for a member that never linked
