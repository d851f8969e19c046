"""The node's per-link telemetry for the scheduler: the delivery counters travel, and a report stays within
the protocol's key limit however many peers the gateway has."""

from __future__ import annotations

from gateways.config import GatewayConfig
from gateways.node import GatewayNode
from gateways.node.reports import MAX_REPORTED_LINKS
from gateways.rounds.config import RoundConfig
from gateways.sending.rx_dispersion import RxDispersion
from wanrt.protocol.limits import MAX_TELEMETRY_KEYS


def _node_with_links(n: int) -> GatewayNode:
    cfg = GatewayConfig(site="a", job="j", secret="x" * 32, rounds=RoundConfig(topology="star"))
    node = GatewayNode(cfg, 0.0)
    node.start(0.0)
    for i in range(n):
        peer = f"p{i:03d}"
        node.allocator.add_link(peer, 100e6)
        node.stats.peer(peer).counters.bytes_sent = 1000 + i
        lt = node.link_times
        lt.busy_s[peer], lt.busy_bytes[peer], lt.peak_bps[peer] = 0.5, 1000, 5e6
        lt.backlog_s[peer], lt.backlog_bytes[peer] = 0.02, 250_000
        rx = node.rx_rates.setdefault(peer, RxDispersion())
        rx.rx_bytes, rx.rx_s, rx.samples, rx.fast = 140_000, 0.037, 1, 2
    return node


def test_the_delivery_counters_are_reported_per_link() -> None:
    m = _node_with_links(2).telemetry(1.0).metrics
    assert m["link.p000.backlog_s"] == 0.02 and m["link.p000.backlog_bytes"] == 250_000.0
    assert m["link.p001.busy_s"] == 0.5
    assert m["link.p000.rx_bytes"] == 140_000.0 and m["link.p000.rx_s"] == 0.037
    assert m["link.p000.rx_n"] == 1.0 and m["link.p000.rx_fast"] == 2.0


def test_a_link_without_tail_samples_reports_no_rx_keys() -> None:
    node = _node_with_links(1)
    node.rx_rates["p000"] = RxDispersion()
    m = node.telemetry(1.0).metrics
    assert "link.p000.rx_s" not in m and "link.p000.backlog_s" in m


def test_a_report_of_the_most_links_stays_within_the_key_limit() -> None:
    m = _node_with_links(MAX_REPORTED_LINKS + 10).telemetry(1.0).metrics
    assert sum(k.endswith(".backlog_s") for k in m) == MAX_REPORTED_LINKS
    assert sum(k.endswith(".rx_s") for k in m) == MAX_REPORTED_LINKS
    assert len(m) <= MAX_TELEMETRY_KEYS
