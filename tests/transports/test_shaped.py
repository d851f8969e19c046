"""ShapedTransport: rate and delay within loose bounds, order under jitter, back-pressure, failures."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from tests.transports.conftest import read_all, read_exactly
from transports import LinkShape, ShapedTransport, Transport, connect, listen, memory_pair
from wanrt.errors import ConfigError, PeerLost, TransportError


async def test_shaped_rate_within_loose_bounds() -> None:
    """8 Mbit/s (1 MB/s): 400 kB after a 16 KiB burst should take about 0.38 s."""
    a, b = memory_pair()
    shaped = ShapedTransport(a, LinkShape(rate_bps=8e6, burst=16 << 10))
    total = 400_000
    t0 = time.monotonic()
    await shaped.send([b"r" * total])
    got = await read_exactly(b, total)
    elapsed = time.monotonic() - t0
    assert got == b"r" * total
    expected = (total - (16 << 10)) / 1e6
    assert 0.8 * expected <= elapsed <= 1.25 * expected, (elapsed, expected)
    await shaped.close()


async def test_one_way_delay_is_applied() -> None:
    a, b = memory_pair()
    shaped = ShapedTransport(a, LinkShape(rate_bps=float("inf"), delay_s=0.15))
    t0 = time.monotonic()
    await shaped.send([b"ping"])
    assert await b.recv() == b"ping"
    elapsed = time.monotonic() - t0
    assert 0.15 <= elapsed < 1.0  # never early; the upper bound only guards against a hang
    await shaped.close()


async def test_jitter_never_reorders() -> None:
    a, b = memory_pair()
    shape = LinkShape(rate_bps=50e6, delay_s=0.01, jitter_s=0.01, chunk=64)
    shaped = ShapedTransport(a, shape, rng=random.Random(7))
    msgs = [i.to_bytes(4, "big") * 16 for i in range(200)]  # 64-byte pieces, one per chunk
    for m in msgs:
        await shaped.send([m])
    await shaped.close()
    assert await read_all(b) == b"".join(msgs)


async def test_set_rate_applies_to_a_transfer_in_progress() -> None:
    """At 0.4 Mbit/s the 200 kB would take 4 s; raising the rate mid-way finishes it far sooner."""
    a, b = memory_pair()
    shaped = ShapedTransport(a, LinkShape(rate_bps=0.4e6, burst=4096, chunk=4096))
    t0 = time.monotonic()
    sender = asyncio.create_task(shaped.send([b"s" * 200_000]))
    first = await b.recv()
    shaped.set_rate(400e6)
    assert shaped.rate_bps == 400e6
    rest = await read_exactly(b, 200_000 - len(first))
    await sender
    assert len(first) + len(rest) == 200_000
    assert time.monotonic() - t0 < 2.0
    await shaped.close()


async def test_back_pressure_bounds_bytes_in_flight() -> None:
    a, b = memory_pair(capacity=32 << 10)  # the receiver does not read at first
    shape = LinkShape(rate_bps=float("inf"), chunk=8 << 10, queue=64 << 10)
    shaped = ShapedTransport(a, shape)
    sent = 0

    async def pump() -> None:
        nonlocal sent
        for _ in range(64):
            await shaped.send([b"q" * (16 << 10)])
            sent += 16 << 10

    task = asyncio.create_task(pump())
    for _ in range(200):
        await asyncio.sleep(0)
    assert not task.done()
    # the queue, plus at most one queue's worth the writer is pushing into the stalled inner link
    assert 0 < shaped.bytes_in_flight <= 2 * shape.queue + shape.chunk
    assert sent <= shaped.bytes_in_flight + (32 << 10) + (16 << 10)
    assert sent < 64 * (16 << 10)
    got = await read_exactly(b, 64 * (16 << 10))
    await task
    assert got == b"q" * (64 * (16 << 10))
    await shaped.flush()
    assert shaped.bytes_in_flight == 0 and shaped.bytes_delivered == len(got)
    await shaped.close()


async def test_close_flushes_delayed_bytes_then_eof() -> None:
    a, b = memory_pair()
    shaped = ShapedTransport(a, LinkShape(rate_bps=80e6, delay_s=0.05))
    await shaped.send([b"last words"])
    await shaped.close()
    assert shaped.closed
    assert await read_all(b) == b"last words"
    with pytest.raises(TransportError):
        await shaped.send([b"more"])


async def test_inner_failure_surfaces_on_send() -> None:
    a, b = memory_pair()
    shaped = ShapedTransport(a, LinkShape(rate_bps=float("inf")))
    b.abort()
    with pytest.raises(PeerLost):
        for _ in range(100):
            await shaped.send([b"x"])
            await asyncio.sleep(0)
    await shaped.close()


async def test_recv_passes_through() -> None:
    a, b = memory_pair()
    shaped = ShapedTransport(a, LinkShape(delay_s=0.5))
    await b.send([b"from the other side"])
    assert await shaped.recv() == b"from the other side"  # not delayed: shaping is per direction
    assert shaped.peer == a.peer
    await shaped.close()


def test_link_shape_validation_and_auto_burst() -> None:
    for bad in ({"rate_bps": 0.0}, {"delay_s": -1.0}, {"jitter_s": float("inf")}, {"chunk": 0}):
        with pytest.raises(ConfigError):
            LinkShape(**bad)
    s = LinkShape(rate_bps=10e9)
    assert s.burst_for(10e9) == int(10e9 * 0.02 / 8)
    assert s.burst_for(1e6) == 64 * 1024
    assert LinkShape(burst=1000).burst_for(10e9) == 1000


async def test_url_query_shapes_outgoing_links_on_both_sides() -> None:
    shapes: list[LinkShape] = []

    async def handler(t: Transport) -> None:
        assert isinstance(t, ShapedTransport)
        shapes.append(t.shape)
        await t.send([await t.recv()])

    async with await listen("mem://shaped-srv?rate=50M&delay=5ms", handler):
        t = await connect("mem://shaped-srv?rate=20M&delay=2ms&jitter=1ms&burst=32KiB")
        assert isinstance(t, ShapedTransport)
        assert t.shape == LinkShape(rate_bps=20e6, delay_s=0.002, jitter_s=0.001, burst=32 << 10)
        await t.send([b"hi"])
        assert await read_exactly(t, 2) == b"hi"
        await t.close()
    assert shapes == [LinkShape(rate_bps=50e6, delay_s=0.005)]
