"""Timed probe trains between two real gateway nodes (handshake, frames, EDF queue; no sockets): a
gateway that reports to a scheduler asks its peer for a train when the job's own messages were not timed,
the peer sends it, and the receiver's tail dispersion times it; the rate reaches the telemetry."""

from __future__ import annotations

import numpy as np
import pytest

from gateways.config import GatewayConfig
from gateways.node import GatewayNode
from gateways.node.actions import ToScheduler
from gateways.sending.probe_trains import train_bytes
from tests.gateways.node.node_mesh import SECRET, NodeMesh
from wanrt.payload import SparsePayload
from wanrt.protocol import Push

RATE = 40e6  # bit/s: the emulated link from a to b
SEG = 1448


def _node(site: str) -> GatewayNode:
    peers = {p: f"tcp://127.0.0.1:{9000 + ord(p)}" for p in "ab" if p != site}
    # a paces its link at a quarter of what the link carries: a train passes the pacer, so it still
    # measures the link (a paced train would read the pacer, which the scheduler leaves out)
    rate = RATE / 4 if site == "a" else 100e6
    node = GatewayNode(GatewayConfig(site=site, job="j", secret=SECRET, peers=peers, link_rate_bps=rate), 0.0)
    node.start(0.0)
    return node


class _PacedMesh(NodeMesh):
    """a → b bytes arrive at ``RATE`` in TCP segments (with their arrival times); b → a at once."""

    def __init__(self, nodes: dict[str, GatewayNode]) -> None:
        super().__init__(nodes)
        self.reports: list[dict[str, float]] = []

    def on_action(self, site: str, action: object) -> bool:
        if site == "b" and isinstance(action, ToScheduler):
            self.reports.append(dict(action.msg.metrics))  # type: ignore[attr-defined]
        return super().on_action(site, action)

    def pump(self) -> None:
        moved = True
        while moved:
            moved = False
            for (x, y), link_id in list(self.links.items()):
                out = self.nodes[x].poll_link(link_id, self.now)
                if not out.parts and out.wait_until is not None and out.wait_until < self.now + 1.0:
                    self.now = out.wait_until  # the writer waits for the pacer, as the daemon's does
                    moved = True
                if not out.parts or (y, x) not in self.links:
                    continue
                data = b"".join(out.parts)
                moved = True
                if x == "b":
                    self.nodes[y].link_data(self.links[(y, x)], data, self.now)
                    continue
                for off in range(0, len(data), SEG):
                    seg = data[off : off + SEG]
                    self.now += 8.0 * len(seg) / RATE
                    self.nodes[y].link_data(self.links[(y, x)], seg, self.now)
            for s, node in self.nodes.items():
                for action in node.pop_actions():
                    moved = self.on_action(s, action) or moved


def test_a_receiver_reporting_to_a_scheduler_asks_for_a_train_and_times_the_link() -> None:
    mesh = _PacedMesh({s: _node(s) for s in "ab"})
    mesh.link("a", "b")
    b = mesh.nodes["b"]
    cfg = b.cfg.delivery
    b.scheduler_connected(mesh.now)
    for s in "ab":
        mesh.nodes[s].trainer_connected(1)
    # the job's messages: 130 kB payloads, whose 65 kB tails cross a 40 Mbit/s link in 13 ms, under the
    # 20 ms a tail needs to be timed: every one is "fast", the link is unmeasured without a train
    payload = SparsePayload.from_dense_blocks(0, np.ones(32768, np.float32), np.arange(2048), 16)
    t0 = mesh.now
    it = 0
    while mesh.now < t0 + 3.5:  # ticks at the telemetry interval
        mesh.now += 0.25
        for s in "ab":
            mesh.nodes[s].trainer_push(1, Push("j", it, 0, 0, s, payload), mesh.now)
        it += 1
        for node in mesh.nodes.values():
            node.tick(mesh.now)
        mesh.pump()
    assert b.rx_rates["a"].fast >= 3  # most of the job's messages were not timed
    assert b.probes.trains >= 1  # asked for, sent by a, timed by b
    assert mesh.nodes["a"].probes.trains == 0  # a reports to no scheduler: it asks for nothing
    got = [r for r in mesh.reports if "link.a.probe_bytes" in r]
    assert got, "the trains' tails reach the scheduler"
    last = got[-1]
    assert 8 * last["link.a.probe_bytes"] / last["link.a.probe_s"] == pytest.approx(RATE, rel=0.05)
    # the first train was sized for the configured prior and the later ones from what the first measured
    assert b.probes._links["a"].rate_bps == pytest.approx(RATE, rel=0.05)
    assert train_bytes(RATE, cfg) < train_bytes(cfg.probe_initial_bps, cfg)
