"""The staleness bound (0 or 1) as a decision, with its cost model (StellaTrain §3.3, partial staleness ≤ 1).

Staleness 1 lets iteration ``t+1`` compute while ``t``'s exchange is on the WAN; staleness 0 waits for it.
With compute time ``C`` (slowest rank) and exchange time ``M`` (payload / bandwidth estimate):

* staleness 0: an iteration takes ``C + M`` — the exchange cannot start before the gradient exists and
  the next step cannot start before the update is back;
* staleness 1: an iteration takes ``max(C, M)`` — the exchange hides behind the next compute.

Time is not everything: a gradient applied one step late converges worse. The convergence profile measures
that as a relative loss penalty ``Δ`` (staleness 1 vs 0 at equal r and Σx; ``wanrt profile`` measures it
next to ḡ, whose own probes run at staleness 1 as in Algorithm 1). Time-to-accuracy is time per iteration
times iterations needed, so with ``ḡ`` the penalty of the plan at staleness 1:

    TTA(1) ∝ max(C, M) · (1 + ḡ)          TTA(0) ∝ (C + M) · (1 + ḡ − Δ)

Staleness 1 is chosen when it saves at least ``staleness_min_gain`` of TTA(0). Hence 0 when communication
is negligible next to compute (``M → 0``: nothing to hide, and staleness would still cost ``Δ``) or when the
profile says staleness costs more than the overlap saves; 1 when the exchange is a sizeable share of the
iteration, which is exactly where Eq. 6 puts the searched plan (``M ≈ C`` on a slow link).
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.control.config import SchedulerConfig
from scheduler.control.objective import G_FLOOR

__all__ = ["StalenessChoice", "choose_staleness"]


@dataclass(frozen=True, slots=True)
class StalenessChoice:
    staleness: int
    #: predicted relative TTA (seconds per unit progress) of each bound
    tta_stale0: float
    tta_stale1: float

    @property
    def gain(self) -> float:
        """Fraction of TTA(0) that staleness 1 saves (negative: it costs)."""
        return 1.0 - self.tta_stale1 / self.tta_stale0


def choose_staleness(
    *,
    compute_s: float,
    exchange_s: float,
    g: float,
    staleness_penalty: float | None,
    config: SchedulerConfig | None = None,
) -> StalenessChoice:
    """The staleness bound with the lower predicted TTA (see the module docstring)."""
    cfg = config if config is not None else SchedulerConfig()
    delta = cfg.staleness_penalty_default if staleness_penalty is None else staleness_penalty
    g1 = max(g, G_FLOOR)
    g0 = max(g1 - delta, G_FLOOR)
    c, m = max(compute_s, 0.0), max(exchange_s, 0.0)
    tta1 = max(c, m) * (1.0 + g1)
    tta0 = (c + m) * (1.0 + g0)
    if tta0 <= 0.0:
        return StalenessChoice(0, tta0, tta1)
    s = 1 if 1.0 - tta1 / tta0 >= cfg.staleness_min_gain else 0
    return StalenessChoice(s, tta0, tta1)
