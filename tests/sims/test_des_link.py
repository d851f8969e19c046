"""The link model: serialisation at the rate, one-way delay, order under jitter, loss as a late write,
trace-driven rate changes, and the send buffer bound."""

from __future__ import annotations

import numpy as np
import pytest

from sims.des.link import LinkModel
from transports.traces import BandwidthTrace


def test_write_takes_bytes_over_rate_plus_delay() -> None:
    link = LinkModel("a", "b", rate_bps=8e6, delay_s=0.02)  # 1 MB/s
    w1 = link.write(100_000, now=1.0)
    assert w1.start == 1.0
    assert w1.end == pytest.approx(1.1)
    assert w1.arrival == pytest.approx(1.12)
    w2 = link.write(50_000, now=1.05)  # serialised behind the first write
    assert w2.start == pytest.approx(1.1)
    assert w2.arrival == pytest.approx(1.17)


def test_trace_changes_the_rate_in_the_middle_of_a_write() -> None:
    trace = BandwidthTrace.from_pairs([(0.0, 8e6), (0.5, 16e6)])  # 1 MB/s, then 2 MB/s from t = 0.5
    link = LinkModel("a", "b", rate_bps=1e6, delay_s=0.0, trace=trace)
    w = link.write(1_000_000, now=0.0)  # 0.5 MB in the first 0.5 s, the other 0.5 MB at 2 MB/s
    assert w.end == pytest.approx(0.75)
    assert link.rate_at(0.6) == pytest.approx(2e6)


def test_looping_trace_repeats() -> None:
    trace = BandwidthTrace.from_pairs([(0.0, 8e6), (1.0, 80e6)], period=2.0)
    link = LinkModel("a", "b", rate_bps=1e6, delay_s=0.0, trace=trace)
    assert link.rate_at(2.5) == pytest.approx(1e6)
    assert link.rate_at(3.5) == pytest.approx(10e6)
    assert link.serialise(2.5, 1_000_000) == pytest.approx(3.0 + 0.05)


def test_jitter_never_reorders() -> None:
    link = LinkModel("a", "b", rate_bps=8e9, delay_s=0.01, jitter_s=0.05, rng=np.random.default_rng(1))
    arrivals = [link.write(100, now=i * 1e-4).arrival for i in range(200)]
    assert arrivals == sorted(arrivals)
    assert max(arrivals[i + 1] - arrivals[i] for i in range(199)) > 1e-3  # jitter did stretch gaps


def test_loss_delays_a_write_by_one_round_trip() -> None:
    link = LinkModel("a", "b", rate_bps=8e9, delay_s=0.01, loss=0.5, rng=np.random.default_rng(2))
    timings = [link.write(10, now=float(i)) for i in range(100)]
    lost = [w for w in timings if w.lost]
    assert 20 < len(lost) < 80
    for w in lost:
        assert w.arrival == pytest.approx(w.end + 0.01 + 0.02)
    assert all(w.arrival == pytest.approx(w.end + 0.01) for w in timings if not w.lost)
    assert link.lost_writes == len(lost)


def test_send_buffer_bounds_what_is_written_ahead() -> None:
    link = LinkModel("a", "b", rate_bps=8e6, delay_s=0.0, buffer_bytes=4096)
    link.write(4096, now=0.0)
    assert not link.has_room(0.0)
    assert link.room_at() == pytest.approx(4096 / 1e6)
    assert link.has_room(link.room_at())
