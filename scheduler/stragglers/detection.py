"""Who is straggling, and for how long: AntDT's two-window detector and an all-links-slow detector.

:class:`StragglerDetector` is AntDT §VI-A steps 2–4 (seed 001). Members (trainer ranks, or whole sites —
the ``scope`` only labels the report) report their batch processing time (BPT); the Monitor averages it
over a short window L^trans and a long window L^per. A member whose short-window mean is ≥ λ × the mean
over all members is a *transient* straggler (→ ADJUST_BS), one whose long-window mean is ≥ λ × the
long-window mean over all members a *persistent* one (→ KILL_RESTART). The short window also gives the
throughput ``v_i = mean(B_i / T_i)`` that Eq. 3 allocates batches by.

:class:`LinkSlowdownDetector` covers what seed 002 leaves open. The gateway's rate allocator confirms a
straggling *link* relative to the median of its peers (K = 3 iterations above 1.2 × median; that filter
stays in the gateway, its confirmed set is passed in here). A WAN that slows down as a whole moves the
median with it, so nothing is confirmed; this detector compares every link with its *own* past instead
and reports when (nearly) all of them slowed at once — a job for the bandwidth estimator, not a straggler
action.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, TypeAlias

from scheduler.stragglers.config import DetectionConfig, LinkConfig
from scheduler.stragglers.windows import TimeWindow
from wanrt.errors import LocalProtocolError

__all__ = [
    "DetectionReport",
    "LinkReport",
    "LinkSlowdownDetector",
    "MemberStatus",
    "StragglerDetector",
    "StragglerKind",
]

StragglerKind: TypeAlias = Literal["none", "transient", "persistent"]


@dataclass(frozen=True)
class MemberStatus:
    """One member's windows; ratios are its mean over the mean of all members (None: no data).

    ``short_s`` / ``long_s`` are mean BPTs, or mean seconds per sample when the detector runs per sample
    and the reports carry batch sizes.
    """

    short_s: float | None
    long_s: float | None
    short_ratio: float | None
    long_ratio: float | None
    throughput: float | None  # samples/s over the short window, AntDT's v_i
    kind: StragglerKind


@dataclass(frozen=True)
class DetectionReport:
    scope: str
    now: float
    members: Mapping[str, MemberStatus]

    @property
    def transient(self) -> list[str]:
        return [m for m, s in self.members.items() if s.kind == "transient"]

    @property
    def persistent(self) -> list[str]:
        return [m for m, s in self.members.items() if s.kind == "persistent"]


class _Member:
    __slots__ = ("bpt_long", "bpt_short", "rate")

    def __init__(self, cfg: DetectionConfig) -> None:
        self.bpt_short = TimeWindow(cfg.short_s, cfg.max_samples)
        self.bpt_long = TimeWindow(cfg.long_s, cfg.max_samples)
        self.rate = TimeWindow(cfg.short_s, cfg.max_samples)


class StragglerDetector:
    """AntDT's Monitor + detection rule for one group of members (ranks or sites)."""

    def __init__(
        self, members: Iterable[str], cfg: DetectionConfig | None = None, scope: str = "rank"
    ) -> None:
        self.cfg = cfg or DetectionConfig()
        self.scope = scope
        self._members: dict[str, _Member] = {}
        for m in members:
            self.add_member(m)

    @property
    def members(self) -> list[str]:
        return list(self._members)

    def add_member(self, member: str) -> None:
        if member in self._members:
            raise LocalProtocolError("member already known", peer=member)
        self._members[member] = _Member(self.cfg)

    def remove_member(self, member: str) -> None:
        self._get(member)
        del self._members[member]

    def forget(self, member: str) -> None:
        """Drop a member's history (after KILL_RESTART the replacement starts with clean windows)."""
        m = self._get(member)
        for w in (m.bpt_short, m.bpt_long, m.rate):
            w.clear()

    def _get(self, member: str) -> _Member:
        try:
            return self._members[member]
        except KeyError:
            raise LocalProtocolError("unknown member", peer=member) from None

    def observe(self, member: str, now: float, bpt_s: float, batch: int | None = None) -> None:
        """One BPT report (a single iteration or an Agent's average over several)."""
        if not (math.isfinite(bpt_s) and bpt_s > 0):
            raise LocalProtocolError("batch processing time must be finite and > 0", peer=member, value=bpt_s)
        m = self._get(member)
        value = bpt_s / batch if self.cfg.per_sample and batch else bpt_s
        m.bpt_short.add(now, value)
        m.bpt_long.add(now, value)
        if batch is not None:
            if batch < 0:
                raise LocalProtocolError("batch size must be ≥ 0", peer=member, value=batch)
            m.rate.add(now, batch / bpt_s)

    def throughput(self, member: str, now: float) -> float | None:
        """AntDT's v_i: mean of B_i / T_i over the short window (samples/s)."""
        w = self._get(member).rate
        w.prune(now)
        return w.mean()

    def report(self, now: float) -> DetectionReport:
        """Classify every member at time ``now`` (persistent wins over transient)."""
        short: dict[str, float | None] = {}
        long_: dict[str, float | None] = {}
        covered: dict[str, bool] = {}
        for name, m in self._members.items():
            for w in (m.bpt_short, m.bpt_long, m.rate):
                w.prune(now)
            short[name] = m.bpt_short.mean()
            long_[name] = m.bpt_long.mean()
            covered[name] = m.bpt_long.coverage(now) >= self.cfg.min_coverage
        mean_short = _mean(short.values())
        mean_long = _mean(v for k, v in long_.items() if covered[k])
        lam = self.cfg.slowness
        out: dict[str, MemberStatus] = {}
        for name, m in self._members.items():
            rs = _ratio(short[name], mean_short)
            rl = _ratio(long_[name], mean_long) if covered[name] else None
            kind: StragglerKind = "none"
            if rl is not None and rl >= lam:
                kind = "persistent"
            elif rs is not None and rs >= lam:
                kind = "transient"
            out[name] = MemberStatus(short[name], long_[name], rs, rl, m.rate.mean(), kind)
        return DetectionReport(self.scope, now, out)


def _mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def _ratio(value: float | None, mean: float | None) -> float | None:
    return None if value is None or mean is None or mean <= 0 else value / mean


@dataclass(frozen=True)
class LinkReport:
    """``all_slow``: at least ``fraction`` of the links run ≥ λ × their own past level right now."""

    now: float
    all_slow: bool
    slow_links: tuple[str, ...]
    ratios: Mapping[str, float | None]
    confirmed: tuple[str, ...]  # seed 002 stragglers as the gateway's allocator last confirmed them


class LinkSlowdownDetector:
    """Per-link time reports in; "the whole WAN slowed down" out."""

    def __init__(self, links: Iterable[str], cfg: LinkConfig | None = None) -> None:
        self.cfg = cfg or LinkConfig()
        self._short: dict[str, TimeWindow] = {}
        self._long: dict[str, TimeWindow] = {}
        self._confirmed: tuple[str, ...] = ()
        for link in links:
            self._short[link] = TimeWindow(self.cfg.short_s, self.cfg.max_samples)
            self._long[link] = TimeWindow(self.cfg.long_s, self.cfg.max_samples)

    def observe(self, now: float, link_times: Mapping[str, float], confirmed: Iterable[str] = ()) -> None:
        """One iteration's per-link times (seconds) and the gateway's confirmed straggler links."""
        for link, t in link_times.items():
            if link not in self._short:
                raise LocalProtocolError("unknown link", peer=link)
            if not (math.isfinite(t) and t >= 0):
                raise LocalProtocolError("link time must be finite and ≥ 0", peer=link, value=t)
            self._short[link].add(now, t)
            self._long[link].add(now, t)
        self._confirmed = tuple(sorted(confirmed))

    def report(self, now: float) -> LinkReport:
        ratios: dict[str, float | None] = {}
        for link, short in self._short.items():
            long_ = self._long[link]
            short.prune(now)
            long_.prune(now)
            # the past level is the long window minus the short one, so a slowdown does not dilute its
            # own reference
            s_sum, s_w = short.sums()
            l_sum, l_w = long_.sums()
            past_w = l_w - s_w
            if s_w <= 0 or past_w <= 0.5:  # less than one sample before the short window
                ratios[link] = None
                continue
            past = (l_sum - s_sum) / past_w
            ratios[link] = (s_sum / s_w) / past if past > 0 else None
        slow = tuple(sorted(k for k, r in ratios.items() if r is not None and r >= self.cfg.slowness))
        known = sum(1 for r in ratios.values() if r is not None)
        all_slow = known > 0 and len(slow) >= math.ceil(self.cfg.fraction * len(ratios) - 1e-9)
        return LinkReport(now, all_slow, slow, ratios, self._confirmed)
