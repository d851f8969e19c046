"""Gateway nodes joined by in-memory links, for node-level tests (test helper).

Bytes a node writes are handed to the other end's node at once; bytes for an end whose link is not up are
lost (as on a connection the other end aborted). Subclasses bring links up their own way (a whole
handshake, half of one) and say what to do with other actions (:meth:`NodeMesh.on_action`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gateways.node import GatewayNode, ToTrainer
from wanrt.payload import SparsePayload
from wanrt.protocol import Connection, Hello, Push, Role, Welcome
from wanrt.protocol.peer.round_frames import GATEWAY_REGISTRY

#: the job secret of every node these tests build
SECRET = "s" * 32


@dataclass
class Handshake:
    """A completed handshake, ``dialer`` → ``acceptor``: each end's connection, the info it sent and the
    info it received; neither node has brought its link up yet."""

    dialer: Connection
    acceptor: Connection
    dialer_sent: dict[str, Any]
    acceptor_sent: dict[str, Any]
    hello_info: dict[str, Any]
    welcome_info: dict[str, Any]


def handshake(na: GatewayNode, nb: GatewayNode) -> Handshake:
    """The real Hello / Welcome / Auth exchange of job "j", ``na`` dialling ``nb``."""
    a, b = na.site, nb.site
    ca = Connection(Role.GATEWAY, a, "j", SECRET.encode(), side="client", registry=GATEWAY_REGISTRY, peer=b)
    cb = Connection(Role.GATEWAY, b, "j", SECRET.encode(), side="server", registry=GATEWAY_REGISTRY, peer=a)
    ours_a = na.link_info(b)
    cb.receive_data(ca.hello(ours_a))
    hello = cb.next_event()
    assert isinstance(hello, Hello)
    ours_b = nb.link_info(a)
    ca.receive_data(cb.accept(ours_b))
    welcome = ca.next_event()
    assert isinstance(welcome, Welcome)
    cb.receive_data(ca.authenticate())
    cb.next_event()
    return Handshake(ca, cb, ours_a, ours_b, dict(hello.info), dict(welcome.info))


def link_nodes(na: GatewayNode, nb: GatewayNode, now: float) -> None:
    """The handshake (``na`` dials), then ``link_up`` on both sides, the acceptor first; a refusal raises."""
    h = handshake(na, nb)
    nb.link_up(na.site, h.acceptor, h.acceptor_sent, h.hello_info, now)
    na.link_up(nb.site, h.dialer, h.dialer_sent, h.welcome_info, now)


class NodeMesh:
    """``links`` maps (site, peer) to that site's link id; ``to_trainer`` what each node sent its trainer."""

    def __init__(self, nodes: dict[str, GatewayNode], now: float = 0.0) -> None:
        self.nodes = nodes
        self.links: dict[tuple[str, str], int] = {}
        self.now = now
        self.to_trainer: dict[str, list[Any]] = {s: [] for s in nodes}

    def link(self, a: str, b: str) -> None:
        """The whole handshake (``a`` dials), both ends up, then what they queued is exchanged."""
        link_nodes(self.nodes[a], self.nodes[b], self.now)
        for x, y in ((a, b), (b, a)):
            link_id = self.nodes[x].link_id_of(y)
            assert link_id is not None
            self.links[(x, y)] = link_id
        self.pump()

    def on_action(self, site: str, action: object) -> bool:
        """Record an action of ``site``'s node; True if it changed the links (pump again)."""
        if isinstance(action, ToTrainer):
            self.to_trainer[site].append(action.msg)
        return False

    def pump(self) -> None:
        moved = True
        while moved:
            moved = False
            for (x, y), link_id in list(self.links.items()):
                out = self.nodes[x].poll_link(link_id, self.now)
                if out.parts and (y, x) in self.links:
                    self.nodes[y].link_data(self.links[(y, x)], b"".join(out.parts), self.now)
                    moved = True
            for s, node in self.nodes.items():
                for action in node.pop_actions():
                    moved = self.on_action(s, action) or moved

    def push(self, site: str, iteration: int) -> None:
        """A two-block push of layer 0 from ``site``'s trainer (session 1)."""
        payload = SparsePayload.from_dense_blocks(0, np.ones(64, np.float32), np.arange(2), 16)
        self.nodes[site].trainer_push(1, Push("j", iteration, 0, 0, site, payload), self.now)
        self.pump()
