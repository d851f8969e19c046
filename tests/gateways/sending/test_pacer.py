"""The pacer lets a writer run ``burst_s`` of the rate ahead of its schedule (what covers an event-loop stall)
and no further: over any span T it releases at most rate × T + burst bytes, whatever the rate."""

from __future__ import annotations

import pytest

from gateways.config import GatewayConfig
from gateways.node import GatewayNode
from gateways.sending.pacer import PACER_BURST_S, Pacer
from tests.wanrt.protocol.peer.gateway_pair import gateway_pair
from transports.link import DEFAULT_BURST_FLOOR

RATE = 100e6  # bit/s: 12.5 MB/s


def _released_by(p: Pacer, until: float, chunk: int = 64 * 1024) -> int:
    """Bytes a writer that always has data gets out by ``until``, asking at each allowed time."""
    now, sent = 0.0, 0
    while True:
        wait = p.delay(chunk, now)
        if now + wait > until:
            return sent
        now += wait
        sent += chunk


@pytest.mark.parametrize("burst_s", [0.02, PACER_BURST_S, 0.2])
def test_a_fresh_link_gets_one_burst_at_once_then_the_rate(burst_s: float) -> None:
    p = Pacer(RATE, 0.0, burst_s)
    burst = max(DEFAULT_BURST_FLOOR, RATE * burst_s / 8)
    assert p.delay(int(burst), 0.0) == 0.0  # the whole bucket leaves at once
    assert p.delay(125_000, 0.0) == pytest.approx(0.01)  # then 10 ms per 125 kB at 100 Mbit/s
    for t in (0.1, 0.5, 2.0):
        got = _released_by(Pacer(RATE, 0.0, burst_s), t)
        assert RATE * t / 8 + burst - 64 * 1024 <= got <= RATE * t / 8 + burst


def test_a_stall_is_covered_up_to_the_burst_and_no_more() -> None:
    p = Pacer(RATE, 0.0, PACER_BURST_S)
    assert p.delay(int(RATE * PACER_BURST_S / 8), 0.0) == 0.0  # the bucket is spent
    # the writer was away 200 ms: it may catch up one bucket (60 ms of rate), not the whole 200 ms
    assert p.delay(int(RATE * 0.06 / 8), 0.2) == 0.0
    assert p.delay(125_000, 0.2) == pytest.approx(0.01)


def test_the_burst_follows_the_rate_when_the_allocator_changes_it() -> None:
    p = Pacer(RATE, 0.0, 0.05)
    p.set_rate(RATE / 4, 0.0)
    assert p.delay(int(RATE / 4 * 0.05 / 8), 0.0) == 0.0
    assert p.delay(31_250, 0.0) == pytest.approx(0.01)  # 10 ms per 31.25 kB at 25 Mbit/s


def test_the_gateway_paces_its_links_with_its_configured_burst() -> None:
    assert GatewayConfig(site="a", job="j", secret="x" * 32).pacer_burst_s == PACER_BURST_S
    cfg = GatewayConfig(
        site="a", job="j", secret="x" * 32, peers={"b": "tcp://10.0.0.2:7700"}, pacer_burst_s=0.2
    )
    node = GatewayNode(cfg, 0.0)
    node.start(0.0)
    conn, _ = gateway_pair(b"pacer-test-secret")
    ch = node.mesh.open("b", conn, RATE, 0.0, confirmed=True)
    assert ch.pacer.delay(int(RATE * 0.2 / 8), 0.0) == 0.0
    assert ch.pacer.delay(125_000, 0.0) == pytest.approx(0.01)
