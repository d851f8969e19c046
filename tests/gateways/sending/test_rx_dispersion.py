"""The receiver's tail-dispersion samples: a burst at a message's head is left out, short tails and
forgotten reads give no sample, and positions (not reads) bound a message."""

from __future__ import annotations

import pytest

from gateways.sending.config import DeliveryConfig
from gateways.sending.rx_dispersion import RxDispersion
from wanrt.errors import ConfigError

RATE = 30e6  # bit/s
SEG = 1448  # a TCP segment's payload


def _paced(rx: RxDispersion, t: float, nbytes: int, rate: float = RATE, seg: int = SEG) -> float:
    """Feed ``nbytes`` arriving at ``rate`` in ``seg``-byte reads from ``t``; returns the last read's time."""
    left = nbytes
    while left > 0:
        n = min(seg, left)
        t += 8.0 * n / rate
        rx.read(t, n)
        left -= n
    return t


def test_a_burst_at_the_head_is_left_out_and_the_tail_reads_the_link() -> None:
    rx = RxDispersion()
    size, burst = 280_000, 75_000  # the emulated link's 20 ms at 30 Mbit/s
    for _ in range(5):  # the bucket's burst: read at once after the idle gap
        rx.read(10.0, burst // 5)
    t_end = _paced(rx, 10.0, size - burst)
    whole = 8.0 * size / (t_end - 10.0)
    assert whole > 1.3 * RATE  # what a sender-side span reads: ≈ 280 / 205 × 30 Mbit/s
    got = rx.message(rx.total, size)
    assert got is not None
    nbytes, secs = got
    assert nbytes <= size // 2
    assert 8.0 * nbytes / secs == pytest.approx(RATE, rel=0.02)
    assert (rx.rx_bytes, rx.rx_s, rx.samples) == (nbytes, secs, 1)


def test_a_tail_shorter_than_the_minimum_gives_no_sample() -> None:
    rx = RxDispersion()
    rx.read(1.0, 10)
    _paced(rx, 1.0, 100_000, rate=100e6)  # its 50 kB tail takes 4 ms
    assert rx.message(rx.total, 100_000) is None
    assert rx.samples == 0 and rx.rx_s == 0.0
    assert rx.fast == 1  # counted: the scheduler's median must not see only the slowed tails


def test_a_tail_inside_one_read_gives_no_sample() -> None:
    rx = RxDispersion()
    rx.read(1.0, 1000)
    rx.read(2.0, 200_000)  # a receiver that stalled reads the whole message at once
    assert rx.message(rx.total, 200_000) is None
    assert rx.fast == 1


def test_messages_below_the_size_threshold_are_not_samples() -> None:
    rx = RxDispersion(DeliveryConfig(rx_min_bytes=64 << 10))
    rx.read(0.0, 1)
    _paced(rx, 0.0, 60_000, rate=1e6)  # 240 ms of tail: long enough, too small a message
    assert rx.message(rx.total, 60_000) is None
    assert rx.message(rx.total, 65_536) is not None


def test_the_ring_is_bounded_and_a_forgotten_half_gives_no_sample() -> None:
    rx = RxDispersion(DeliveryConfig(rx_ring_reads=16))
    rx.read(0.0, 1)
    _paced(rx, 0.0, 200_000)  # ~140 reads
    assert len(rx._reads) == 16
    assert rx.message(rx.total, 200_000) is None  # its half-way byte came ~70 reads ago
    assert rx.total == 200_001 and rx.fast == 0  # not known to be fast either


def test_a_read_carrying_one_message_s_end_and_the_next_one_s_start() -> None:
    rx = RxDispersion()
    rx.read(0.0, 1)
    size = 200_000  # a 100 kB tail: 27 ms at 30 Mbit/s
    t = _paced(rx, 0.0, size - 1000)  # message A up to 1000 bytes before its end
    t += 8.0 * 3000 / RATE
    rx.read(t, 3000)  # A's last 1000 bytes and B's first 2000
    a_end = rx.total - 2000  # the bytes read but not yet framed: B's start
    got = rx.message(a_end, size)
    assert got is not None
    assert 8.0 * got[0] / got[1] == pytest.approx(RATE, rel=0.03)
    t = _paced(rx, t, size - 2000)  # the rest of B, back to back
    got_b = rx.message(rx.total, size)
    assert got_b is not None
    assert 8.0 * got_b[0] / got_b[1] == pytest.approx(RATE, rel=0.03)
    assert rx.samples == 2 and rx.rx_bytes == got[0] + got_b[0]


def test_a_message_past_the_bytes_read_or_on_a_new_stream_gives_no_sample() -> None:
    rx = RxDispersion()
    rx.read(0.0, 1)
    _paced(rx, 0.0, 200_000)
    assert rx.message(rx.total + 1, 200_000) is None
    rx.new_stream()  # a reconnect: the old connection's reads are not this stream's
    assert rx.message(rx.total, 200_000) is None


def test_disabled_reports_nothing() -> None:
    rx = RxDispersion(DeliveryConfig(rx_enabled=False))
    rx.read(0.0, 1)
    _paced(rx, 0.0, 200_000)
    assert rx.message(rx.total, 200_000) is None


@pytest.mark.parametrize(
    ("key", "value"), [("rx_min_bytes", 1), ("rx_min_tail_s", 0.0), ("rx_ring_reads", 1)]
)
def test_bad_settings_are_config_errors(key: str, value: float) -> None:
    with pytest.raises(ConfigError) as exc:
        DeliveryConfig(**{key: value})
    assert exc.value.key == key
