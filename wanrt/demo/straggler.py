"""``wanrt demo --straggler SITE:INTENSITY[:persistent]``: slow one site's trainers as AntDT's evaluation does

AntDT §VII-A4 (seed 001) emulates resource contention by inserting a sleep into the training procedure,
``T_delay = SleepDuration × Intensity`` per iteration (SleepDuration 1.5 s, Intensity 0.1–0.8); transient
stragglers are disturbed for 15 minutes of every 30, persistent ones from start to end.

Here the delay models a device that computes more slowly (a busy or slower GPU): it is proportional to the
samples the rank processes, ``T_delay = SleepDuration × Intensity × B_i / B``, where ``B`` is the demo's
configured per-rank batch and SleepDuration is scaled to the demo's iteration time (``DemoConfig.
straggler_sleep_s``, tenths of a second against AntDT's seconds). At the configured batch the delay is
exactly AntDT's; a site given fewer samples by ADJUST_BS waits less — which is the straggler that ADJUST_BS
can fix. (A fixed delay per iteration, whatever the batch, could not be fixed by moving samples.) The
sleep goes between backward and the optimizer step, so the trainer's step timing counts it as compute,
not as waiting for the WAN. Without ``:persistent`` the site is slowed for the first half of every
``straggler_period_s`` (AntDT's 15 of 30 minutes, scaled), with it for the whole run.

Plain data and arithmetic: the trainer passes its own clock in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from wanrt.errors import ConfigError

__all__ = ["FLAG", "Slowdown", "StragglerSpec", "parse_straggler"]

FLAG: Final = "--straggler"
#: AntDT's Intensity is 0..1; up to 10 lets a demo show a straggler slower than the paper's worst
MAX_INTENSITY: Final = 10.0


@dataclass(frozen=True)
class StragglerSpec:
    """Which site is slowed, how hard (AntDT's Intensity), and whether for the whole run."""

    site: str
    intensity: float
    persistent: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.intensity) and 0.0 < self.intensity <= MAX_INTENSITY):
            raise ConfigError(
                f"{FLAG}: intensity must be in (0, {MAX_INTENSITY:g}], got {self.intensity!r}",
                key=FLAG,
                value=self.intensity,
            )

    def __str__(self) -> str:
        return f"{self.site}:{self.intensity:g}" + (":persistent" if self.persistent else "")


def parse_straggler(text: str, sites: tuple[str, ...] | None = None) -> StragglerSpec:
    """``SITE:INTENSITY[:persistent]`` → a spec; ``sites`` (if given) are the demo's site names."""
    parts = text.strip().split(":")
    if len(parts) not in (2, 3) or not parts[0]:
        raise ConfigError(
            f"{FLAG}: expected SITE:INTENSITY[:persistent] (e.g. c:0.8:persistent), got {text!r}",
            key=FLAG,
            value=text,
        )
    site, raw = parts[0], parts[1]
    if len(parts) == 3 and parts[2] != "persistent":
        raise ConfigError(f"{FLAG}: the third field may only be 'persistent', got {parts[2]!r}", key=FLAG)
    try:
        intensity = float(raw)
    except ValueError:
        raise ConfigError(f"{FLAG}: intensity {raw!r} is not a number", key=FLAG, value=raw) from None
    if sites is not None and site not in sites:
        raise ConfigError(
            f"{FLAG}: no site {site!r} in this demo (sites: {', '.join(sites)})", key=FLAG, value=site
        )
    return StragglerSpec(site, intensity, len(parts) == 3)


@dataclass(frozen=True)
class Slowdown:
    """What one trainer of the straggling site sleeps: ``per_sample_s`` × its batch, while active."""

    per_sample_s: float
    persistent: bool
    period_s: float

    @classmethod
    def of(cls, spec: StragglerSpec, sleep_s: float, batch: int, period_s: float) -> Slowdown:
        """AntDT's ``SleepDuration × Intensity`` at the configured per-rank ``batch``, spread per sample."""
        return cls(sleep_s * spec.intensity / batch, spec.persistent, period_s)

    def active(self, since_go_s: float) -> bool:
        """Persistent: always. Transient: the first half of every period (AntDT: 15 of every 30 minutes)."""
        if self.persistent:
            return True
        return (since_go_s % self.period_s) < 0.5 * self.period_s

    def delay_s(self, batch: int, since_go_s: float) -> float:
        return self.per_sample_s * batch if self.active(since_go_s) else 0.0
