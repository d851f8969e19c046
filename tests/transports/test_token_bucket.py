"""TokenBucket on a fake clock: exact arithmetic, no sleeping."""

from __future__ import annotations

import math

import pytest

from transports import TokenBucket
from wanrt.errors import ConfigError

MBIT = 1e6  # 1 Mbit/s = 125 000 bytes/s


def test_starts_full_and_sends_burst_immediately() -> None:
    b = TokenBucket(8 * MBIT, burst=10_000, now=100.0)
    assert b.reserve(10_000, 100.0) == 100.0
    assert b.tokens(100.0) == 0.0


def test_debt_is_paced_at_the_rate() -> None:
    b = TokenBucket(8 * MBIT, burst=1_000, now=0.0)  # 1e6 bytes/s
    assert b.reserve(1_000, 0.0) == 0.0
    assert b.reserve(500_000, 0.0) == pytest.approx(0.5)
    # the next byte queues behind the debt
    assert b.reserve(1_000_000, 0.25) == pytest.approx(1.5)
    assert b.ready_at(1.5) == 1.5


def test_refill_is_capped_at_burst() -> None:
    b = TokenBucket(8 * MBIT, burst=2_000, now=0.0)
    b.reserve(2_000, 0.0)
    assert b.tokens(10.0) == 2_000.0
    assert b.reserve(3_000, 10.0) == pytest.approx(10.001)


def test_set_rate_retimes_outstanding_debt() -> None:
    b = TokenBucket(8 * MBIT, burst=1, now=0.0)
    b.reserve(1, 0.0)
    assert b.reserve(1_000_000, 0.0) == pytest.approx(1.0)
    # half a second later half the debt is repaid; at 4x the rate the rest takes 1/8 s
    b.set_rate(32 * MBIT, 0.5)
    assert b.ready_at(0.5) == pytest.approx(0.625)
    b.set_rate(4 * MBIT, 0.625)
    assert b.ready_at(0.625) == pytest.approx(0.625)


def test_set_rate_can_shrink_burst() -> None:
    b = TokenBucket(8 * MBIT, burst=10_000, now=0.0)
    b.set_rate(8 * MBIT, 0.0, burst=100)
    assert b.burst == 100
    assert b.tokens(0.0) == 100.0


def test_unlimited_rate_never_waits() -> None:
    b = TokenBucket(math.inf, burst=1, now=0.0)
    assert b.reserve(10**9, 0.0) == 0.0
    assert b.reserve(10**9, 0.0) == 0.0


def test_clock_going_back_earns_nothing() -> None:
    b = TokenBucket(8 * MBIT, burst=1_000, now=5.0)
    b.reserve(1_000, 5.0)
    assert b.tokens(4.0) == 0.0
    assert b.tokens(5.001) == pytest.approx(1_000.0)


@pytest.mark.parametrize(("rate", "burst"), [(0.0, 10), (-1.0, 10), (1e6, 0)])
def test_rejects_bad_parameters(rate: float, burst: int) -> None:
    with pytest.raises(ConfigError):
        TokenBucket(rate, burst)
    with pytest.raises(ValueError):
        TokenBucket(1e6, 10).reserve(-1, 0.0)
