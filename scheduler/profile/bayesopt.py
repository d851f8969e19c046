"""Algorithm 1 (StellaTrain §4.3): Bayesian optimisation of the convergence penalty over (r, Σx).

::

    y_base ← TESTRUN(r = 0, (x_min + x_max)/2, staleness 0)               line 12
    for t = 1 … N:                                                          line 13
        r ← random in [r_min, r_max]                                        line 14
        x ← argmax_x EI(r, x) over [x_min, x_max]  (random for the first few)  line 15
        y ← TESTRUN(r, x, staleness 1)                                      line 16
        GP ← GP + ((r, x) → log(y / y_base))                                line 17

The GP is refitted (hyperparameters by marginal likelihood) after every probe; ``N`` probes in all, the
baseline and the optional staleness measurement (``TESTRUN(0, x_mid, 1)`` against the baseline) on top.
The probe is any callable ``(r, total_batch, staleness) -> final loss``, so the loop is tested with
synthetic functions and runs the real :class:`~wanrt.demo.digits_probe.DigitsProbe` in ``wanrt profile``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scheduler.profile.acquisition import batch_candidates, choose_batch
from scheduler.profile.config import ProfileConfig
from scheduler.profile.surrogate import LOG_RATIO_CAP, ConvergenceProfile
from wanrt.errors import ConfigError

__all__ = ["ProbeFn", "ProbeRecord", "ProfileRun", "run_profile"]

ProbeFn = Callable[[float, int, int], float]


@dataclass(frozen=True, slots=True)
class ProbeRecord:
    r: float
    total_batch: int
    staleness: int
    loss: float
    #: "baseline", "staleness", "random" or "ei"
    kind: str


@dataclass
class ProfileRun:
    profile: ConvergenceProfile
    records: list[ProbeRecord] = field(default_factory=list)

    @property
    def probes(self) -> int:
        """Algorithm 1's N: the probes that became GP points (baseline and staleness runs not counted)."""
        return sum(1 for rec in self.records if rec.kind in ("random", "ei"))


def _log_ratio(loss: float, base: float) -> float:
    if not math.isfinite(loss):
        return LOG_RATIO_CAP
    return min(math.log(max(loss, 1e-12) / base), LOG_RATIO_CAP)


def _draw_r(rng: np.random.Generator, cfg: ProfileConfig) -> float:
    if cfg.r_sampling == "uniform":
        return float(rng.uniform(cfg.r_min, cfg.r_max))
    u0, u1 = -math.log10(1.0 - cfg.r_min), -math.log10(1.0 - cfg.r_max)
    return float(1.0 - 10.0 ** (-rng.uniform(u0, u1)))


def run_profile(
    probe: ProbeFn,
    config: ProfileConfig,
    *,
    describe: Mapping[str, Any] | None = None,
    on_probe: Callable[[ProbeRecord], None] | None = None,
) -> ProfileRun:
    """Run Algorithm 1 with ``probe`` and return the fitted profile and every probe's record."""
    cfg = config
    rng = np.random.default_rng(cfg.seed)
    records: list[ProbeRecord] = []

    def run(r: float, x: int, s: int, kind: str) -> float:
        loss = float(probe(r, x, s))
        rec = ProbeRecord(r, x, s, loss, kind)
        records.append(rec)
        if on_probe is not None:
            on_probe(rec)
        return loss

    mid = cfg.middle_batch
    base = run(0.0, mid, 0, "baseline")
    if not (math.isfinite(base) and base > 0):
        raise ConfigError(
            f"the baseline probe (r=0, batch {mid}, staleness 0) ended at loss {base}; "
            "lower the learning rate or widen the model",
            key="probe.lr",
            value=base,
        )
    staleness = None
    if cfg.measure_staleness:
        staleness = math.expm1(_log_ratio(run(0.0, mid, 1, "staleness"), base))
    cands = batch_candidates(cfg.min_total_batch, cfg.max_total_batch, cfg.batch_candidates)
    rs: list[float] = []
    xs: list[float] = []
    ys: list[float] = []
    common: dict[str, Any] = {
        "r_range": (cfg.r_min, cfg.r_max),
        "batch_range": (float(cfg.min_total_batch), float(cfg.max_total_batch)),
        "baseline_loss": base,
        "baseline_batch": mid,
        "staleness": staleness,
        "probe": dict(describe or {}),
        "restarts": cfg.gp_restarts,
        "seed": cfg.seed,
    }
    # the random start is stratified over the batch range (one draw per equal slice of the log-spaced
    # candidates, in random order): five uniform draws can easily all land in one end
    strata = (np.arange(cfg.init_probes) + rng.uniform(size=cfg.init_probes)) / cfg.init_probes
    init_x = cands[np.minimum((strata * cands.size).astype(np.int64), cands.size - 1)]
    rng.shuffle(init_x)
    for t in range(cfg.probes):
        r = _draw_r(rng, cfg)
        if t < cfg.init_probes:
            x = int(init_x[t])
            kind = "random"
        else:
            gp = ConvergenceProfile.fit(rs, xs, ys, **common)
            x, _ = choose_batch(gp.predict_log_ratio, r, cands, xi=cfg.ei_xi)
            kind = "ei"
        loss = run(r, x, 1, kind)
        rs.append(r)
        xs.append(float(x))
        ys.append(_log_ratio(loss, base))
    profile = ConvergenceProfile.fit(rs, xs, ys, **common)
    return ProfileRun(profile, records)
