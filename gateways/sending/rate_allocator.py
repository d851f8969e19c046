"""Per-link send-rate targets that shift bandwidth towards a persistently straggling WAN link (sans-IO).

A synchronous round ends when its slowest link finishes (T_iter = max_i T_flow_i), so per-flow fairness is
the wrong goal: speeding up the fast links buys nothing, slowing them a little to speed up the slow one
buys a shorter round. This is seed 002 ("Straggler-Aware Scheduler for Distributed Training"; the source
papers are listed in docs/architecture.md), whose rules are followed literally:

* **Persistence-filtered detection** — ``streak_i ← streak_i + 1 if T_i > 1.2 × T_med else 0``;
  link i is a confirmed straggler when ``streak_i ≥ K`` (K = 3). T_med is the median link time of the same
  iteration, so the threshold follows background load, and one microburst never triggers anything.
* **Asymmetric reallocation** — for the set S of confirmed stragglers among N links:
  ``r'_i = r_i × (1 + α)`` for i ∈ S and ``r'_j = r_j × (1 − β·|S| / (N − |S|))`` for the donors
  (α = 0.3, β = 0.15): help the straggler aggressively, penalise the donors gently.
* **Gradual recovery** — a link that is no longer slow drifts back, ``r ← (1 − w)·r + w·r_base`` with
  w = 0.5, so a fix is undone in steps rather than bouncing straight back into the straggling state.
* **Cooldown** — no adjustment at all (neither reallocation nor recovery) for 5 iterations after a
  reallocation, so the effect of one decision is measured before the next.

What the paper leaves open, decided here (all in :class:`~gateways.config.RateConfig`): boosts compound
across reallocations while a link stays slow, bounded by ``max_boost × r_base``; donors never fall below
``min_share × r_base`` (the paper's factor turns negative once |S| > N/(1+β)); ``conserve_total``
optionally rescales so the rates sum to the base sum, since a real uplink cannot honour the paper's net
gain of (α − β)·|S| shares. Recovery applies to links whose current streak is 0 — a link that is slow
again but not yet confirmed keeps its rate.

**Hold** (``hold = true``, ours): the paper gates recovery on the link no longer being slow, but a boost
that works makes a *persistent* straggler look fine, so the literal rule recovers it, the link straggles
again, is re-confirmed after K iterations and re-boosted: a sawtooth of boost 1.6×–2.9× on a 3× link that
spends a third of the rounds at the bad end (measured on real daemons and on the fluid model alike). The
paper's own remedy for oscillation is to filter what it reacts to (persistence filter, cooldown), so the
recovery decision here is filtered the same way, on the quantity that is persistent: the link's time at
its *base* rate, ``T_i × r_i / r_base,i`` — the paper's network model ``delay_i = d_base / r_i`` inverted,
so the boost's own effect is taken out. A boosted link recovers only in an iteration in which it would not
have been slow (> slow_factor × the median of those base-rate times) at its base rate; donors keep their
penalty while any boost it pays for is held, so the reallocation stays what the paper made it (and sums to
the base sum under ``conserve_total``). A transient straggler is not slow at base once its burst ends and
recovers exactly as before; a persistent one keeps the allocation at which it stopped being confirmed.

Detection is relative, so a WAN that slows down uniformly triggers nothing (the paper says so too); that
case belongs to the scheduler's bandwidth estimator, not here.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, TypeAlias

from gateways.sending.config import RateConfig
from wanrt.errors import ConfigError, LocalProtocolError

__all__ = ["Action", "LinkState", "RateAllocator", "RateSnapshot"]

#: What the last :meth:`RateAllocator.observe` did (for /status and logs).
Action: TypeAlias = Literal["none", "reallocate", "recover", "hold", "cooldown"]

# Rates within this relative distance of the base rate snap to it, so recovery ends in finitely many steps
# and /status shows "at base" instead of an endless tail of tiny differences.
_SNAP = 1e-3


@dataclass(frozen=True, slots=True)
class LinkState:
    """One link as /status shows it."""

    base_bps: float
    rate_bps: float
    streak: int
    straggler: bool
    last_time_s: float | None
    slow_at_base: bool = False  # the last time scaled to the base rate was slow: a boost here is held


@dataclass(frozen=True, slots=True)
class RateSnapshot:
    """The allocator's state for /status: per-link rates and streaks, and what it last did."""

    iteration: int | None
    median_s: float | None
    last_action: Action
    last_reallocation: int | None
    reallocations: int
    links: Mapping[str, LinkState]

    @property
    def stragglers(self) -> list[str]:
        return [p for p, s in self.links.items() if s.straggler]


class RateAllocator:
    """Turns per-iteration link times into per-link target send rates (bit/s); time is never read here."""

    def __init__(
        self, links: Iterable[str], base_rates: Mapping[str, float], cfg: RateConfig | None = None
    ) -> None:
        self.cfg = cfg or RateConfig()
        self._base: dict[str, float] = {}
        self._rate: dict[str, float] = {}
        self._streak: dict[str, int] = {}
        self._last: dict[str, float | None] = {}
        self._slow_at_base: dict[str, bool] = {}
        for link in links:
            self.add_link(link, base_rates.get(link, math.nan))
        self._iteration: int | None = None
        self._median: float | None = None
        self._last_realloc: int | None = None
        self._reallocations = 0
        self._action: Action = "none"

    # -- membership and base rates -------------------------------------------------------------------

    def add_link(self, link: str, base_bps: float) -> None:
        if link in self._base:
            raise LocalProtocolError("link already known", peer=link)
        self._base[link] = 0.0
        self.set_base_rate(link, base_bps)
        self._rate[link] = self._base[link]
        self._streak[link] = 0
        self._last[link] = None
        self._slow_at_base[link] = False

    def remove_link(self, link: str) -> None:
        """Forget a lost peer; the survivors keep their rates (recovery will bring them back to base)."""
        self._known(link)
        for table in (self._base, self._rate, self._streak, self._last, self._slow_at_base):
            del table[link]

    def set_base_rate(self, link: str, base_bps: float) -> None:
        """Move a link's base (e.g. the scheduler's new bandwidth estimate); its current rate scales along."""
        self._known(link)
        if not (math.isfinite(base_bps) and base_bps > 0):
            raise ConfigError(
                f"base rate of link {link!r} must be a positive number", key=link, value=base_bps
            )
        old = self._base[link]
        self._base[link] = float(base_bps)
        if old > 0:
            self._rate[link] *= base_bps / old

    def _known(self, link: str) -> None:
        if link not in self._base:
            raise LocalProtocolError("unknown link", peer=link)

    # -- the policy ----------------------------------------------------------------------------------

    def observe(self, iteration: int, link_times: Mapping[str, float]) -> dict[str, float]:
        """Feed the link times of one finished iteration; returns every link's new target rate.

        Links absent from ``link_times`` (nothing sent, peer down) keep their streak and are left out of
        the median. ``inf`` is a valid time (a transfer that never finished); NaN or negative is a bug.
        """
        if self._iteration is not None and iteration <= self._iteration:
            raise LocalProtocolError("iterations must increase", value=iteration, limit=self._iteration)
        for link, t in link_times.items():
            self._known(link)
            if math.isnan(t) or t < 0:
                raise LocalProtocolError("link time must be >= 0", peer=link, value=t)
        self._iteration = iteration
        if not self.cfg.enabled:
            self._action = "none"
            return self.rates()
        self._detect(link_times)
        cooling = self._last_realloc is not None and iteration - self._last_realloc < self.cfg.cooldown
        stragglers = [p for p, s in self._streak.items() if s >= self.cfg.streak]
        if cooling:
            self._action = "cooldown"
        elif stragglers and len(stragglers) < len(self._base):
            self._reallocate(stragglers)
            self._last_realloc = iteration
            self._reallocations += 1
            self._action = "reallocate"
        else:
            self._action = self._recover()
        return self.rates()

    def _detect(self, link_times: Mapping[str, float]) -> None:
        """Seed 002's persistence filter: count consecutive iterations slower than slow_factor × median.

        Also marks the links that would have been slow at their base rate (the hold's input): the same
        test on ``T_i × r_i / r_base,i``, the time the link would have taken unboosted and unpenalised.
        """
        self._median = statistics.median(link_times.values()) if link_times else None
        for link, t in link_times.items():
            self._last[link] = t
            self._streak[link] = self._streak[link] + 1 if self._is_slow(t, self._median) else 0
        at_base = {p: t * self._rate[p] / self._base[p] for p, t in link_times.items()}
        median_at_base = statistics.median(at_base.values()) if at_base else None
        for link, t in at_base.items():
            self._slow_at_base[link] = self._is_slow(t, median_at_base)

    def _is_slow(self, t: float, median: float | None) -> bool:
        return median is not None and median > 0 and t > self.cfg.slow_factor * median

    def _reallocate(self, stragglers: list[str]) -> None:
        """Seed 002's asymmetric rule: r(1 + α) for stragglers, r(1 − β·|S|/(N − |S|)) for donors."""
        n, s = len(self._base), len(stragglers)
        boost = 1.0 + self.cfg.alpha
        penalty = 1.0 - self.cfg.beta * s / (n - s)
        chosen = set(stragglers)
        for link in self._rate:
            self._rate[link] *= boost if link in chosen else penalty
        if self.cfg.conserve_total:
            scale = sum(self._base.values()) / sum(self._rate.values())
            for link in self._rate:
                self._rate[link] *= scale
        self._clamp()

    def _recover(self) -> Action:
        """EMA towards the base rate for links that are not slow right now, except what the hold keeps.

        With ``hold``, a boosted link that is still slow at its base rate keeps its boost, and every donor
        keeps its penalty while any such boost stands (the penalty is what pays for it).
        """
        w = self.cfg.recovery
        held = {
            p for p, r in self._rate.items() if self.cfg.hold and r > self._base[p] and self._slow_at_base[p]
        }
        moved = False
        for link, rate in self._rate.items():
            base = self._base[link]
            if self._streak[link] or rate == base or link in held or (held and rate < base):
                continue
            new = (1.0 - w) * rate + w * base
            self._rate[link] = base if abs(new - base) <= _SNAP * base else new
            moved = True
        return "recover" if moved else "hold" if held else "none"

    def _clamp(self) -> None:
        for link, rate in self._rate.items():
            base = self._base[link]
            self._rate[link] = min(max(rate, self.cfg.min_share * base), self.cfg.max_boost * base)

    # -- introspection -------------------------------------------------------------------------------

    def rates(self) -> dict[str, float]:
        """Current target rate of every link, bit/s."""
        return dict(self._rate)

    @property
    def reallocations(self) -> int:
        return self._reallocations

    def snapshot(self) -> RateSnapshot:
        return RateSnapshot(
            iteration=self._iteration,
            median_s=self._median,
            last_action=self._action,
            last_reallocation=self._last_realloc,
            reallocations=self._reallocations,
            links={
                p: LinkState(
                    base_bps=self._base[p],
                    rate_bps=self._rate[p],
                    streak=self._streak[p],
                    straggler=self._streak[p] >= self.cfg.streak,
                    last_time_s=self._last[p],
                    slow_at_base=self._slow_at_base[p],
                )
                for p in self._base
            },
        )
