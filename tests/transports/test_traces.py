"""Bandwidth traces: files, the seed-002 profiles, and the driver on a fake clock (exact)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from transports import BandwidthTrace, TracePlayer, drive_trace, profile_traces
from wanrt.errors import ConfigError


class FakeClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    async def sleep(self, dt: float) -> None:
        assert dt >= 0
        self.now += dt


class Recorder:
    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.calls: list[tuple[float, float]] = []

    def set_rate(self, rate_bps: float) -> None:
        self.calls.append((self.clock.now, rate_bps))


def test_rate_at_step_function_and_period() -> None:
    tr = BandwidthTrace(((1.0, 10.0), (2.0, 20.0)), period=4.0)
    assert tr.rate_at(0.5) is None
    assert tr.rate_at(1.0) == 10.0
    assert tr.rate_at(3.9) == 20.0
    assert tr.rate_at(4.5) == 20.0  # next period, before its first step: previous rate holds
    assert tr.rate_at(5.0) == 10.0
    assert BandwidthTrace(((0.0, 10.0), (1.0, 30.0)), period=2.0).mean_rate() == pytest.approx(20.0)


@pytest.mark.parametrize(
    "steps", [(), ((1.0, 5.0), (1.0, 6.0)), ((0.0, 0.0),), ((-1.0, 5.0),), ((0.0, float("nan")),)]
)
def test_invalid_traces_rejected(steps: tuple[tuple[float, float], ...]) -> None:
    with pytest.raises(ConfigError):
        BandwidthTrace(steps)


def test_period_must_exceed_last_step() -> None:
    with pytest.raises(ConfigError, match="period"):
        BandwidthTrace(((0.0, 1.0), (3.0, 2.0)), period=3.0)


def test_csv_and_json_round_trip(tmp_path: Path) -> None:
    tr = BandwidthTrace(((0.0, 100e6), (0.5, 25e6), (2.0, 1e9)))
    for name in ("t.csv", "t.json"):
        tr.save(tmp_path / name)
        assert BandwidthTrace.load(tmp_path / name) == tr
    (tmp_path / "h.csv").write_text("# measured\ntime,rate\n0,100M\n1.5,2.5G\n")
    assert BandwidthTrace.load(tmp_path / "h.csv").steps == ((0.0, 100e6), (1.5, 2.5e9))
    (tmp_path / "l.json").write_text(json.dumps([[0, 5], [1, 6]]))
    assert BandwidthTrace.load(tmp_path / "l.json").steps == ((0.0, 5.0), (1.0, 6.0))


@pytest.mark.parametrize(
    ("name", "text"),
    [("a.csv", "0,1M\n1,oops\n"), ("b.csv", "0,1,2\n"), ("c.json", '{"step": []}'), ("d.json", "[[0]]")],
)
def test_malformed_files_raise_config_error(tmp_path: Path, name: str, text: str) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError):
        BandwidthTrace.load(tmp_path / name)
    with pytest.raises(ConfigError):
        BandwidthTrace.load(tmp_path / "missing.csv")


def test_profiles_follow_seed_002() -> None:
    base = 100e6
    uni = profile_traces("uniform", 4, base_bps=base, duration_s=10)
    assert all(t.steps == ((0.0, base),) for t in uni)
    strag = profile_traces("straggler", 4, base_bps=base, duration_s=10, straggler=2)
    assert [t.steps[0][1] for t in strag] == [base, base, base / 3, base]
    var = profile_traces("variable", 3, base_bps=base, duration_s=2000, seed=1)
    rel = np.array([base / r for t in var for _, r in t.steps])  # relative transfer time ~ N(1, 0.2²)
    assert len(rel) == 3 * 2000
    assert abs(rel.mean() - 1.0) < 0.02 and abs(rel.std() - 0.2) < 0.02
    bursty = profile_traces("bursty", 3, base_bps=base, duration_s=3000, seed=2)
    rates = np.array([r for t in bursty for _, r in t.steps])
    assert set(np.unique(rates)) == {base / 5, base}
    assert abs(float(np.mean(rates == base / 5)) - 0.2) < 0.02
    again = profile_traces("bursty", 3, base_bps=base, duration_s=3000, seed=2)
    assert again == bursty


def test_player_skips_superseded_steps() -> None:
    p = TracePlayer(BandwidthTrace(((0.0, 1.0), (1.0, 2.0), (2.0, 3.0))), start=10.0)
    assert p.due(9.0) is None
    assert p.next_at() == 10.0
    assert p.due(11.5) == 2.0
    assert p.next_at() == 12.0
    assert p.due(12.0) == 3.0
    assert p.next_at() is None


async def test_drive_trace_sets_rates_at_step_times() -> None:
    clock = FakeClock(100.0)
    rec = Recorder(clock)
    tr = BandwidthTrace(((0.0, 10.0), (0.25, 20.0), (1.0, 5.0)))
    await drive_trace(rec, tr, clock=clock, sleep=clock.sleep)
    assert rec.calls == [(100.0, 10.0), (100.25, 20.0), (101.0, 5.0)]


async def test_drive_looping_trace_repeats_until_cancelled() -> None:
    clock = FakeClock(0.0)
    rec = Recorder(clock)
    tr = BandwidthTrace(((0.0, 1.0), (1.0, 2.0)), period=3.0)

    async def sleep(dt: float) -> None:
        await clock.sleep(dt)
        if clock.now >= 7.0:
            raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        await drive_trace(rec, tr, clock=clock, sleep=sleep)
    assert rec.calls == [(0.0, 1.0), (1.0, 2.0), (3.0, 1.0), (4.0, 2.0), (6.0, 1.0)]
