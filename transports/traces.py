"""Bandwidth over time for emulated links: traces, the seed-002 link profiles, and a driver.

The scheduler's job is to adapt to the bandwidth the WAN gives *right now*, so the demo and tests need links
whose rate moves. A :class:`BandwidthTrace` is a step function ``(t, bit/s)``; :class:`TracePlayer` is the
sans-IO part (which rate is due at ``now``, when is the next step), :func:`drive_trace` the thin asyncio
driver that calls ``set_rate`` on a :class:`~transports.shaped.ShapedTransport` (or anything with
``set_rate``).

:func:`profile_traces` generates the four link profiles of the straggler-aware scheduler
(seeds/002, "Network Model" and "Four Profiles"): there a link's transfer time is ``d_base / r_i``, so a
link *k× slower* gets bandwidth ``base / k``:

* ``uniform``: every link at the base rate ("all 10ms");
* ``straggler``: one link persistently 3× slower;
* ``variable``: per step the relative transfer time is drawn from N(1, σ²) (the seed's N(d_base, σ²) with
  σ unspecified; we default to σ = 0.2 and clip at 0.1 so a draw never means infinite bandwidth);
* ``bursty``: per step, with probability 20 %, a link is 5× slower.
"""

from __future__ import annotations

import csv
import json
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from transports.urls import parse_rate
from wanrt.config import check
from wanrt.errors import ConfigError

__all__ = [
    "PROFILES",
    "BandwidthTrace",
    "RateSettable",
    "TracePlayer",
    "drive_trace",
    "profile_traces",
]

Profile = Literal["uniform", "straggler", "variable", "bursty"]
PROFILES: tuple[Profile, ...] = ("uniform", "straggler", "variable", "bursty")

#: A trace file is operator input, not peer input, but a runaway generator should still fail clearly.
MAX_TRACE_STEPS = 10_000_000


@dataclass(frozen=True)
class BandwidthTrace:
    """Rate steps ``(t_seconds, bit/s)`` with strictly increasing ``t >= 0``.

    Before the first step the link keeps its configured rate. With ``period`` the steps repeat every
    ``period`` seconds (which must exceed the last step time), so a short measured trace can drive a long run.
    """

    steps: tuple[tuple[float, float], ...]
    period: float | None = None

    def __post_init__(self) -> None:
        check(len(self.steps) >= 1, "steps", len(self.steps), "a trace needs at least one step")
        check(len(self.steps) <= MAX_TRACE_STEPS, "steps", len(self.steps), f"at most {MAX_TRACE_STEPS}")
        last = -math.inf
        for i, (t, bps) in enumerate(self.steps):
            check(math.isfinite(t) and t >= 0, f"steps[{i}].t", t, "must be finite and >= 0")
            check(t > last, f"steps[{i}].t", t, "step times must be strictly increasing")
            check(bps > 0 and not math.isnan(bps), f"steps[{i}].bps", bps, "must be > 0")
            last = t
        check(
            self.period is None or (math.isfinite(self.period) and self.period > last),
            "period",
            self.period,
            "must be finite and exceed the last step time",
        )

    @classmethod
    def from_pairs(cls, pairs: Iterable[Sequence[float]], period: float | None = None) -> BandwidthTrace:
        return cls(tuple((float(t), float(r)) for t, r in pairs), period)

    @property
    def duration(self) -> float:
        """Time of the last step (one period for a looping trace)."""
        return self.period if self.period is not None else self.steps[-1][0]

    def rate_at(self, t: float) -> float | None:
        """Rate in force ``t`` seconds after the start; ``None`` before the first step."""
        if self.period is not None and t >= self.period:
            t = t % self.period
            if t < self.steps[0][0]:
                return self.steps[-1][1]  # the previous period's last step still holds
        times = [s[0] for s in self.steps]
        i = int(np.searchsorted(times, t, side="right")) - 1
        return None if i < 0 else self.steps[i][1]

    def mean_rate(self) -> float:
        """Time-weighted mean rate from the first step to :attr:`duration` (the last rate if that is 0)."""
        end = self.duration
        total, span = 0.0, 0.0
        for (t0, r), nxt in zip(self.steps, [*self.steps[1:], (end, 0.0)], strict=True):
            dt = max(0.0, nxt[0] - t0)
            total, span = total + r * dt, span + dt
        return total / span if span > 0 else self.steps[-1][1]

    # -- files ---------------------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | Path) -> BandwidthTrace:
        """Read ``.json`` (``{"steps": [[t, bps], ...], "period": p}`` or a bare list) or CSV (``t,bps``).

        CSV rates may carry SI suffixes (``100M``); a non-numeric first row is a header; ``#`` starts a
        comment line.
        """
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read trace {p}: {exc}", path=str(p)) from None
        try:
            if p.suffix.lower() == ".json":
                return cls._from_json(json.loads(text))
            return cls._from_csv(text)
        except (ValueError, TypeError, KeyError) as exc:
            if isinstance(exc, ConfigError):
                raise ConfigError(
                    f"trace {p}: {exc.message}", key=exc.fields.get("key"), path=str(p)
                ) from None
            raise ConfigError(f"trace {p} is malformed: {exc}", path=str(p)) from None

    @classmethod
    def _from_json(cls, data: Any) -> BandwidthTrace:
        if isinstance(data, dict):
            period = data.get("period")
            return cls.from_pairs(data["steps"], None if period is None else float(period))
        return cls.from_pairs(data)

    @classmethod
    def _from_csv(cls, text: str) -> BandwidthTrace:
        pairs: list[tuple[float, float]] = []
        for n, row in enumerate(csv.reader(line for line in text.splitlines() if not line.startswith("#"))):
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) != 2:
                raise ConfigError(f"row {n + 1}: want 't,bps', got {row!r}", key=f"row{n + 1}")
            try:
                t = float(row[0])
            except ValueError:
                if n == 0:
                    continue  # header
                raise
            pairs.append((t, parse_rate(row[1], f"row{n + 1}.bps")))
        return cls.from_pairs(pairs)

    def save(self, path: str | Path) -> None:
        p = Path(path)
        if p.suffix.lower() == ".json":
            p.write_text(json.dumps({"steps": [list(s) for s in self.steps], "period": self.period}))
        else:
            p.write_text("t,bps\n" + "".join(f"{t!r},{r!r}\n" for t, r in self.steps))


def profile_traces(
    profile: Profile,
    n_links: int,
    *,
    base_bps: float,
    duration_s: float,
    step_s: float = 1.0,
    seed: int = 0,
    straggler: int = 0,
    slowdown: float = 3.0,
    sigma: float = 0.2,
    burst_factor: float = 5.0,
    burst_prob: float = 0.2,
) -> list[BandwidthTrace]:
    """One trace per link for a seed-002 profile (see the module docstring); reproducible by ``seed``."""
    check(profile in PROFILES, "profile", profile, f"must be one of {PROFILES}")
    check(n_links >= 1, "n_links", n_links, "must be >= 1")
    check(base_bps > 0, "base_bps", base_bps, "must be > 0")
    check(step_s > 0 and duration_s >= step_s, "duration_s", duration_s, "must be >= step_s > 0")
    check(0 <= straggler < n_links, "straggler", straggler, "must index a link")
    check(slowdown >= 1 and burst_factor >= 1, "slowdown", (slowdown, burst_factor), "factors must be >= 1")
    check(0 <= burst_prob <= 1, "burst_prob", burst_prob, "must be in [0, 1]")
    check(sigma >= 0, "sigma", sigma, "must be >= 0")
    n_steps = int(duration_s // step_s)
    check(n_steps <= MAX_TRACE_STEPS, "duration_s", duration_s, "too many steps")
    times = np.arange(n_steps) * step_s
    rng = np.random.default_rng(seed)
    out = []
    for link in range(n_links):
        if profile == "uniform":
            rates = np.full(1, base_bps)
        elif profile == "straggler":
            rates = np.full(1, base_bps / slowdown if link == straggler else base_bps)
        elif profile == "variable":
            rel_time = np.maximum(rng.normal(1.0, sigma, n_steps), 0.1)
            rates = base_bps / rel_time
        else:
            slow = rng.random(n_steps) < burst_prob
            rates = np.where(slow, base_bps / burst_factor, base_bps)
        out.append(BandwidthTrace.from_pairs(zip(times[: len(rates)], rates, strict=True)))
    return out


class RateSettable(Protocol):
    def set_rate(self, rate_bps: float) -> None: ...


class TracePlayer:
    """Sans-IO replay of a trace from absolute time ``start``.

    The driver asks :meth:`due` for the rate to apply now and sleeps until :meth:`next_at`; the same object
    runs on the simulator's virtual clock.
    """

    def __init__(self, trace: BandwidthTrace, start: float) -> None:
        self.trace = trace
        self.start = start
        self._index = 0
        self._cycle = 0

    def _time_of(self, index: int, cycle: int) -> float:
        base = self.start + (cycle * self.trace.period if self.trace.period is not None else 0.0)
        return base + self.trace.steps[index][0]

    def next_at(self) -> float | None:
        """Absolute time of the next step not yet returned by :meth:`due`; ``None`` when finished."""
        if self._index >= len(self.trace.steps):
            return None
        return self._time_of(self._index, self._cycle)

    def due(self, now: float) -> float | None:
        """The newest rate whose time has come (older ones it supersedes are skipped), else ``None``."""
        rate = None
        while (at := self.next_at()) is not None and at <= now:
            rate = self.trace.steps[self._index][1]
            self._index += 1
            if self._index == len(self.trace.steps) and self.trace.period is not None:
                self._index, self._cycle = 0, self._cycle + 1
        return rate


async def drive_trace(
    target: RateSettable,
    trace: BandwidthTrace,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[Any]] | None = None,
    start: float | None = None,
) -> None:
    """Apply ``trace`` to ``target`` until it ends (a looping trace runs until cancelled); ``sleep``
    defaults to :func:`asyncio.sleep` (imported here: the sans-IO node and simulator load this module)."""
    if sleep is None:
        import asyncio

        sleep = asyncio.sleep
    player = TracePlayer(trace, clock() if start is None else start)
    while True:
        rate = player.due(clock())
        if rate is not None:
            target.set_rate(rate)
        at = player.next_at()
        if at is None:
            return
        await sleep(max(0.0, at - clock()))
