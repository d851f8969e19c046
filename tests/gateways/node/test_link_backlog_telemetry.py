"""The transport's delivery while backlogged reaches the scheduler in the gateway's telemetry."""

from __future__ import annotations

from gateways.config import GatewayConfig
from gateways.node import GatewayNode
from tests.gateways.node.node_mesh import SECRET, NodeMesh

SITES = ("a", "b")


def _node(site: str) -> GatewayNode:
    peers = {p: f"tcp://127.0.0.1:{9000 + ord(p)}" for p in SITES if p != site}
    node = GatewayNode(GatewayConfig(site=site, job="j", secret=SECRET, peers=peers), 0.0)
    node.start(0.0)
    return node


def test_backlog_counters_are_reported_per_peer_and_only_once_measured() -> None:
    mesh = NodeMesh({s: _node(s) for s in SITES}, now=0.1)
    mesh.link("a", "b")
    a = mesh.nodes["a"]
    lid = a.link_id_of("b")
    assert lid is not None
    m = a.telemetry(1.0).metrics
    assert "link.b.backlog_s" not in m  # nothing measured yet: no key, not a zero rate
    a.link_backlog(lid, 0, 0.0)  # an idle link: still nothing to report
    assert "link.b.backlog_s" not in a.telemetry(1.0).metrics
    a.link_backlog(lid, 1.25e6, 0.1)
    m = a.telemetry(2.0).metrics
    assert (m["link.b.backlog_bytes"], m["link.b.backlog_s"]) == (1.25e6, 0.1)
    a.link_backlog(10_000, 5e6, 1.0)  # an unknown link: ignored
    assert a.telemetry(3.0).metrics["link.b.backlog_bytes"] == 1.25e6
