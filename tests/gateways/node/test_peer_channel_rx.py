"""The peer channel feeds the receiver's tail dispersion from real frames: a chunked round message that
arrives behind a burst reads the paced rate, from stream positions the connection reports."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gateways.node.peer_channel import PeerChannel
from gateways.sending.edf_queue import EdfQueue
from gateways.sending.link_times import LinkTimes
from gateways.sending.pacer import Pacer
from gateways.sending.rx_dispersion import RxDispersion
from gateways.stats import LinkCounters
from tests.wanrt.protocol.peer.gateway_pair import gateway_pair
from wanrt.payload import SparsePayload
from wanrt.protocol import Connection
from wanrt.protocol.peer.round_msg import RoundMsg

SECRET = b"peer-channel-rx-test-secret"
RATE = 30e6
SEG = 1448


def _channel(conn: Connection, peer: str, rx: RxDispersion | None) -> PeerChannel:
    return PeerChannel(
        0,
        peer,
        conn,
        queue=EdfQueue(chunk_bytes=64 << 10, coalesce_bytes=1024),
        item_ids=itertools.count(),
        pacer=Pacer(1e12, 0.0),
        link_times=LinkTimes(3),
        counters=LinkCounters(),
        now=0.0,
        rx=rx,
    )


def _payload(n_blocks: int) -> SparsePayload:
    rng = np.random.default_rng(n_blocks)
    idx = np.sort(rng.choice(4 * n_blocks, size=n_blocks, replace=False)).astype(np.int64)
    return SparsePayload(2, 64 * n_blocks, 16, idx, rng.standard_normal(16 * n_blocks).astype(np.float32))


def _wire(a: PeerChannel, *msgs: RoundMsg) -> bytes:
    for m in msgs:
        a.send_round(m)
    data = b""
    while (out := a.poll(0.0)).parts:
        data += b"".join(out.parts)
    return data


def _arrive(b: PeerChannel, data: bytes, t: float, head: int) -> tuple[float, list[object]]:
    """``head`` bytes at once at ``t`` (a token bucket's burst), the rest paced at RATE."""
    events: list[object] = list(b.receive(data[:head], t))
    for i in range(head, len(data), SEG):
        part = data[i : i + SEG]
        t += 8.0 * len(part) / RATE
        events += list(b.receive(part, t))
    return t, events


def test_a_chunked_message_behind_a_burst_reads_the_paced_rate() -> None:
    c, s = gateway_pair(SECRET)
    rx = RxDispersion()
    a, b = _channel(c, "b", None), _channel(s, "a", rx)
    msg = RoundMsg("final", 4, 2, 1, _payload(4096), (("a", 4), ("b", 4)))  # ~300 kB: 5 chunks
    data = _wire(a, msg)
    assert len(data) > 200_000
    _, events = _arrive(b, data, 1.0, head=len(data) // 4)
    assert len(events) == 2  # the tag and the reassembled Push
    assert rx.samples == 1 and rx.last is not None
    nbytes, secs = rx.last
    assert len(data) // 2 - SEG <= nbytes <= len(data) // 2
    assert 8.0 * nbytes / secs == pytest.approx(RATE, rel=0.02)


def test_back_to_back_messages_each_read_the_rate_and_small_ones_none() -> None:
    c, s = gateway_pair(SECRET)
    rx = RxDispersion()
    a, b = _channel(c, "b", None), _channel(s, "a", rx)
    big1 = RoundMsg("final", 4, 2, 1, _payload(4096), (("a", 4), ("b", 4)))
    small = RoundMsg("partial", 5, 2, 1, _payload(8), (("a", 5),))
    big2 = RoundMsg("final", 6, 2, 1, _payload(4000), (("a", 6), ("b", 6)))
    data = _wire(a, big1, small, big2)
    _arrive(b, data, 1.0, head=60_000)
    assert rx.samples == 2  # the two large messages; the small one's extent is its own frame
    assert 8.0 * rx.rx_bytes / rx.rx_s == pytest.approx(RATE, rel=0.02)
