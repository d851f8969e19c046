"""ShapedTransport's delivery while backlogged: bytes over time while bytes queued for the bucket.

Driven on an injected clock through the shaper's release step, so the counts are exact, not timed."""

from __future__ import annotations

import pytest

from transports import LinkShape, ShapedTransport, memory_pair

CHUNK = 16384
RATE = 8e6  # 1 MB/s: one chunk every 16.384 ms


def _shaper(now: list[float]) -> ShapedTransport:
    a, _ = memory_pair()
    shape = LinkShape(rate_bps=RATE, burst=CHUNK, chunk=CHUNK)
    return ShapedTransport(a, shape, clock=lambda: now[0])


def _queue(s: ShapedTransport, pieces: int) -> None:
    for _ in range(pieces):  # what ``send`` queues, without the writer task (the test is the writer)
        s._pending.append(b"x" * CHUNK)
        s._pending_bytes += CHUNK


def test_a_backlogged_link_reads_its_rate_exactly_and_the_burst_is_not_counted() -> None:
    now = [0.0]
    s = _shaper(now)
    _queue(s, 10)
    step = CHUNK * 8 / RATE
    for k in range(11):  # the writer wakes exactly when the bucket allows the next piece
        s._release(k * step)
    s._release(10 * step)  # queue empty: the period closes
    # the first piece went out on the burst (no backlog); the second opened the period with its deficit
    assert s.backlog_bytes == 9 * CHUNK
    assert s.backlog_s == pytest.approx(9 * step)
    assert 8 * s.backlog_bytes / s.backlog_s == pytest.approx(RATE)


def test_a_late_writer_never_reads_above_the_link() -> None:
    now = [0.0]
    s = _shaper(now)
    _queue(s, 6)
    s._release(0.0)  # piece 1 on the burst, piece 2 waits: the period opens
    s._release(0.2)  # woke 180 ms late: tokens for many pieces have accrued (capped at the burst)
    for k in range(1, 8):
        s._release(0.2 + k * CHUNK * 8 / RATE)
    assert s.backlog_s > 0
    assert 8 * s.backlog_bytes / s.backlog_s <= RATE * (1 + 1e-9)


def test_an_idle_link_has_no_backlog() -> None:
    now = [0.0]
    s = _shaper(now)
    _queue(s, 1)  # fits the burst
    s._release(0.0)
    s._release(1.0)
    assert (s.backlog_bytes, s.backlog_s) == (0, 0.0)


async def test_a_real_transfer_reports_a_backlog_rate_not_above_the_link() -> None:
    a, b = memory_pair()
    shaped = ShapedTransport(a, LinkShape(rate_bps=RATE, burst=CHUNK, chunk=CHUNK))
    total = 300_000
    await shaped.send([b"r" * total])
    got = 0
    while got < total:
        got += len(await b.recv())
    await shaped.flush()
    assert 0 < shaped.backlog_bytes <= total
    assert 8 * shaped.backlog_bytes / shaped.backlog_s <= RATE * (1 + 1e-6)
    await shaped.close()
