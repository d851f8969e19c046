"""What one demo run measured, the comparison of the arms, the printed table and the JSON.

Three arms: ``dense`` (what DDP would send), ``wanrt`` (compressed exchange at fixed settings: the
scheduler off) and ``adaptive`` (the same trainers and gateways with the job's scheduler deciding density,
per-site batch sizes and staleness; absent with ``--no-scheduler``). Ratios are oriented so that bigger is
better for wanrt, except ``final_loss_ratio`` and the iteration ratios (wanrt over dense, ≈ 1 means the
same quality): ``tta_speedup`` = dense time-to-target / wanrt's, ``iter_speedup`` = wanrt iterations per
second / dense's, ``bytes_ratio`` = dense WAN bytes / wanrt's (both to their stop). The adaptive arm's
ratios carry an ``adaptive_`` prefix, and ``adaptive_vs_fixed_tta`` = the fixed arm's time-to-target over
the adaptive arm's (> 1: the scheduler helped).
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from wanrt.protocol.job_settings import per_site

__all__ = [
    "ARM_LABELS",
    "Comparison",
    "CurvePoint",
    "DecisionPoint",
    "RunResult",
    "compare",
    "format_table",
    "write_json",
]

#: how the table and the plot name each run
ARM_LABELS: Final = {
    "dense": "dense (DDP-like)",
    "wanrt": "wanrt fixed",
    "adaptive": "wanrt adaptive",
    "mitigated": "stragglers mitigated",
}


#: a loss spike counts after this iteration: the first iterations' loss may rise while the weights leave
#: their initialisation, which is no instability
SPIKE_AFTER: Final = 20
#: seconds after a step of the fluctuating link's trace that ``bw_tracking_error`` leaves out
TRACKING_SETTLE_S: Final = 2.0


@dataclass(frozen=True)
class CurvePoint:
    """The training-split loss after ``iteration`` steps, ``t`` seconds after the run's start."""

    t: float
    iteration: int
    loss: float
    accuracy: float


@dataclass(frozen=True)
class DecisionPoint:
    """One line of the scheduler's decisions file, ``t`` seconds after the run's start.

    ``kind``: ``commit`` (every gateway committed ``values`` from ``effective_iteration`` on), ``adopted``,
    or ``tick`` (the policy was asked; ``bandwidth_estimate_bps`` is what it believed then, None before
    it had telemetry). ``bandwidth_step`` (raise/lower/hold) when the estimator updated since the line
    before.
    """

    t: float
    kind: str
    decision: int | None
    effective_iteration: int | None
    values: Mapping[str, Any] | None
    bandwidth_estimate_bps: float | None
    bandwidth_step: str | None = None
    #: a commit's reason (``bandwidth_change``, ``warmup_stage``, ``initial``, ``periodic``, ...)
    reason: str | None = None


@dataclass(frozen=True)
class RunResult:
    mode: str
    iterations: int
    target_loss: float
    #: seconds from the start until the training-split loss first fell to the target; None if it never did
    tta_s: float | None
    iters_to_target: int | None
    #: seconds from the start to the end of the last step
    train_s: float
    final_loss: float
    final_accuracy: float
    curve: tuple[CurvePoint, ...]
    #: (iteration, seconds since the start) at the end of every step of the first site's leader
    step_times: tuple[tuple[int, float], ...]
    wan_bytes_sent: int
    wan_bytes_received: int
    bytes_sent_per_site: Mapping[str, int]
    rounds_completed: Mapping[str, int]
    #: how many different final parameter sets the S × R trainers ended with (1 = all identical)
    distinct_final_models: int
    #: what the trainers started with: ``density``, ``staleness``, ``batch`` (per rank)
    settings: Mapping[str, Any] = field(default_factory=dict)
    #: per site, the per-rank batch its data loaders drew at the end (what actually reached them)
    final_batch: Mapping[str, int] = field(default_factory=dict)
    #: samples trained on, summed over every rank
    samples: int = 0
    #: the scheduler's decisions file (adaptive arm only)
    decisions: tuple[DecisionPoint, ...] = ()
    #: the fluctuating link's rate as (seconds since the start, bit/s) steps, from the trace the demo wrote
    link_trace: tuple[tuple[float, float], ...] = ()
    #: the time budget (s) that stopped this run before the target (the dense arm's ``dense_budget_s``);
    #: None: it reached the target or stopped for another reason
    budget_s: float | None = None

    @property
    def iters_per_s(self) -> float:
        return self.iterations / self.train_s if self.train_s > 0 else 0.0

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.train_s if self.train_s > 0 else 0.0

    @property
    def commits(self) -> tuple[DecisionPoint, ...]:
        """Committed decisions that took effect within the run (the last may have come too late)."""
        return tuple(
            d
            for d in self.decisions
            if d.kind in ("commit", "adopted")
            and d.values is not None
            and d.effective_iteration is not None
            and d.effective_iteration < self.iterations
        )

    @property
    def final_settings(self) -> dict[str, Any]:
        """The settings in force at the last iteration: the start's, updated by every commit in effect."""
        out = dict(self.settings)
        for d in self.commits:
            out.update(d.values or {})
        return out

    def steady_iteration_s(self, warmup: int) -> float:
        """Mean seconds per iteration after the first ``warmup`` iterations (connection set-up, first
        compressions, the pipeline filling up), from the first site leader's step times."""
        steps = [(i, t) for i, t in self.step_times if i >= warmup]
        if len(steps) < 2:
            raise ValueError(f"need at least 2 steps after {warmup} warm-up iterations, got {len(steps)}")
        (i0, t0), (i1, t1) = steps[0], steps[-1]
        return (t1 - t0) / (i1 - i0)

    @property
    def reached(self) -> bool:
        return self.tta_s is not None

    @property
    def loss_spike_ratio(self) -> float | None:
        """The largest training-split loss after iteration :data:`SPIKE_AFTER` over the lowest loss seen
        before it (1 or less: the loss never rose above its best so far). A loss spike is what a user reads
        as instability (sparse + error feedback + staleness, docs/client.md); None without two points."""
        lowest = math.inf
        worst: float | None = None
        for p in self.curve:
            if p.iteration > SPIKE_AFTER and math.isfinite(lowest) and lowest > 0:
                ratio = p.loss / lowest if math.isfinite(p.loss) else math.inf
                worst = ratio if worst is None else max(worst, ratio)
            lowest = min(lowest, p.loss)
        return worst

    @property
    def bw_tracking_error(self) -> float | None:
        """The median over the scheduler's decide ticks of |estimate − true rate| / true rate of the
        fluctuating link (``link_trace``), leaving out the :data:`TRACKING_SETTLE_S` after the start and after
        each step of the trace (an estimate needs samples of the new rate first). None without a trace or
        without a tick outside those spans (a trace that steps every 2 s or faster has none)."""
        trace = self.link_trace
        if not trace:
            return None
        # the start counts as a step: the estimate begins at the configured prior, which says nothing
        steps = [trace[0][0]] + [
            t for (t, b), (_, before) in zip(trace[1:], trace, strict=False) if b != before
        ]
        errors = []
        for d in self.decisions:
            est = d.bandwidth_estimate_bps
            if d.kind != "tick" or est is None or any(0 <= d.t - t < TRACKING_SETTLE_S for t in steps):
                continue
            rate = next((bps for t, bps in reversed(trace) if t <= d.t), trace[0][1])
            if rate > 0:
                errors.append(abs(est - rate) / rate)
        return float(statistics.median(errors)) if errors else None

    @property
    def initial_loss(self) -> float:
        return self.curve[0].loss if self.curve else math.nan

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["curve"] = [dataclasses.asdict(p) for p in self.curve]
        out["step_times"] = [list(s) for s in self.step_times]
        out["bytes_sent_per_site"] = dict(self.bytes_sent_per_site)
        out["rounds_completed"] = dict(self.rounds_completed)
        out["settings"] = dict(self.settings)
        out["final_batch"] = dict(self.final_batch)
        out["decisions"] = [dataclasses.asdict(d) for d in self.decisions]
        out["link_trace"] = [list(p) for p in self.link_trace]
        out["iters_per_s"] = self.iters_per_s
        out["samples_per_s"] = self.samples_per_s
        out["reached_target"] = self.reached
        out["final_settings"] = self.final_settings
        out["decisions_committed"] = len(self.commits)
        out["loss_spike_ratio"] = self.loss_spike_ratio
        out["bw_tracking_error"] = self.bw_tracking_error
        return out


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0 or not math.isfinite(num) or not math.isfinite(den):
        return None
    return num / den


def _its(r: RunResult | None) -> float | None:
    return None if r is None else _n(r.iters_to_target)


def _n(iterations: int | None) -> float | None:
    return None if iterations is None else float(iterations)


@dataclass(frozen=True)
class Comparison:
    dense: RunResult
    wanrt: RunResult
    #: the run with the scheduler (None: ``--no-scheduler``)
    adaptive: RunResult | None = None
    #: the dense arm again on unshaped links, counting its iterations to the target when the shaped arm
    #: stopped at its budget (:meth:`~wanrt.demo.runner.Demo.replay_dense`); None: no replay
    dense_replay: RunResult | None = None

    @property
    def arms(self) -> tuple[RunResult, ...]:
        return (self.dense, self.wanrt) if self.adaptive is None else (self.dense, self.wanrt, self.adaptive)

    # -- fixed wanrt vs dense (the demo's original keys) ---------------------------------------------

    @property
    def tta_speedup(self) -> float | None:
        return _ratio(self.dense.tta_s, self.wanrt.tta_s)

    @property
    def tta_speedup_at_least(self) -> float | None:
        """With dense stopped unfinished at its budget: its training time over wanrt's time to target, a
        lower bound on ``tta_speedup`` (dense needed longer than it ran). None otherwise."""
        return _lower_bound(self.dense, self.wanrt)

    @property
    def adaptive_tta_speedup_at_least(self) -> float | None:
        """As :attr:`tta_speedup_at_least`, for the adaptive arm."""
        return None if self.adaptive is None else _lower_bound(self.dense, self.adaptive)

    @property
    def iter_speedup(self) -> float | None:
        return _ratio(self.wanrt.iters_per_s, self.dense.iters_per_s)

    @property
    def final_loss_ratio(self) -> float | None:
        return _ratio(self.wanrt.final_loss, self.dense.final_loss)

    @property
    def bytes_ratio(self) -> float | None:
        return _ratio(float(self.dense.wan_bytes_sent), float(self.wanrt.wan_bytes_sent))

    @property
    def bytes_per_iter_ratio(self) -> float | None:
        return _bytes_per_iter_ratio(self.dense, self.wanrt)

    @property
    def dense_iters_to_target(self) -> int | None:
        """The dense arm's iterations to the target: its own, or (stopped at its budget) the unshaped
        replay's, which is the same count (staleness 0 makes the trajectory link-independent)."""
        if self.dense.iters_to_target is not None:
            return self.dense.iters_to_target
        return None if self.dense_replay is None else self.dense_replay.iters_to_target

    @property
    def dense_iters_to_target_source(self) -> str | None:
        """Where :attr:`dense_iters_to_target` comes from: ``dense arm`` or ``unshaped replay``."""
        if self.dense.iters_to_target is not None:
            return "dense arm"
        return "unshaped replay" if self.dense_iters_to_target is not None else None

    @property
    def iters_to_target_ratio(self) -> float | None:
        return _ratio(_its(self.wanrt), _n(self.dense_iters_to_target))

    # -- the adaptive arm ------------------------------------------------------------------------------

    @property
    def adaptive_vs_fixed_tta(self) -> float | None:
        """The fixed arm's time-to-target over the adaptive arm's: > 1 when the scheduler helped."""
        a = self.adaptive
        return None if a is None else _ratio(self.wanrt.tta_s, a.tta_s)

    @property
    def adaptive_vs_fixed_iters(self) -> float | None:
        """Adaptive iterations to target over the fixed arm's."""
        return _ratio(_its(self.adaptive), _its(self.wanrt))

    @property
    def adaptive_tta_speedup(self) -> float | None:
        a = self.adaptive
        return None if a is None else _ratio(self.dense.tta_s, a.tta_s)

    @property
    def adaptive_iter_speedup(self) -> float | None:
        a = self.adaptive
        return None if a is None else _ratio(a.iters_per_s, self.dense.iters_per_s)

    @property
    def adaptive_final_loss_ratio(self) -> float | None:
        a = self.adaptive
        return None if a is None else _ratio(a.final_loss, self.dense.final_loss)

    @property
    def adaptive_bytes_ratio(self) -> float | None:
        a = self.adaptive
        return None if a is None else _ratio(float(self.dense.wan_bytes_sent), float(a.wan_bytes_sent))

    @property
    def adaptive_bytes_per_iter_ratio(self) -> float | None:
        a = self.adaptive
        return None if a is None else _bytes_per_iter_ratio(self.dense, a)

    @property
    def adaptive_iters_to_target_ratio(self) -> float | None:
        """Adaptive iterations to target over dense's (issue 25's ``iters_to_target_ratio``, adaptive over
        dense), dense's count from :attr:`dense_iters_to_target`."""
        return _ratio(_its(self.adaptive), _n(self.dense_iters_to_target))

    def to_json(self, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "tta_speedup": self.tta_speedup,
            "tta_speedup_at_least": self.tta_speedup_at_least,
            "adaptive_tta_speedup_at_least": self.adaptive_tta_speedup_at_least,
            "iter_speedup": self.iter_speedup,
            "final_loss_ratio": self.final_loss_ratio,
            "bytes_ratio": self.bytes_ratio,
            "bytes_per_iter_ratio": self.bytes_per_iter_ratio,
            "iters_to_target_ratio": self.iters_to_target_ratio,
            "dense_iters_to_target": self.dense_iters_to_target,
            "dense_iters_to_target_source": self.dense_iters_to_target_source,
            "adaptive_vs_fixed_tta": self.adaptive_vs_fixed_tta,
            "adaptive_vs_fixed_iters": self.adaptive_vs_fixed_iters,
            "adaptive_tta_speedup": self.adaptive_tta_speedup,
            "adaptive_iter_speedup": self.adaptive_iter_speedup,
            "adaptive_final_loss_ratio": self.adaptive_final_loss_ratio,
            "adaptive_bytes_ratio": self.adaptive_bytes_ratio,
            "adaptive_bytes_per_iter_ratio": self.adaptive_bytes_per_iter_ratio,
            "adaptive_iters_to_target_ratio": self.adaptive_iters_to_target_ratio,
            "loss_spike_ratio": {r.mode: r.loss_spike_ratio for r in self.arms},
            "bw_tracking_error": None if self.adaptive is None else self.adaptive.bw_tracking_error,
            "dense": self.dense.to_json(),
            "wanrt": self.wanrt.to_json(),
            "adaptive": None if self.adaptive is None else self.adaptive.to_json(),
            "dense_replay": None if self.dense_replay is None else self.dense_replay.to_json(),
        }
        out.update(extra or {})
        return out


def _lower_bound(dense: RunResult, other: RunResult) -> float | None:
    if dense.budget_s is None or dense.reached:
        return None
    return _ratio(dense.train_s, other.tta_s)


def _bytes_per_iter_ratio(dense: RunResult, other: RunResult) -> float | None:
    d = _ratio(float(dense.wan_bytes_sent), float(dense.iterations))
    w = _ratio(float(other.wan_bytes_sent), float(other.iterations))
    return _ratio(d, w)


def compare(
    dense: RunResult,
    wanrt: RunResult,
    adaptive: RunResult | None = None,
    dense_replay: RunResult | None = None,
) -> Comparison:
    return Comparison(dense, wanrt, adaptive, dense_replay)


def _bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def _x(r: float | None, better: str) -> str:
    return "n/a" if r is None else f"{r:.2f}× {better}"


def _settings(r: RunResult) -> str:
    """``density, batch/rank`` in force at the end: one batch for all sites, or each site's."""
    st = r.final_settings
    density = st.get("density")
    batches = dict(r.final_batch) or per_site(st, "batch_size")
    if batches and len(set(batches.values())) > 1:
        batch = " ".join(f"{site} {b}" for site, b in sorted(batches.items()))
    elif batches:
        batch = str(next(iter(batches.values())))
    else:
        batch = str(st.get("batch", "?"))
    return f"{density:.3g}, {batch}" if isinstance(density, (int, float)) else batch


def _tracking(r: RunResult) -> str:
    """The adaptive arm's ``bw_tracking_error`` for the table (a median of relative errors)."""
    e = r.bw_tracking_error
    if e is None:
        return "n/a" if not r.link_trace else f"n/a (no tick {TRACKING_SETTLE_S:g} s after a step)"
    return f"{100 * e:.0f} % (median)"


def format_table(c: Comparison) -> str:
    """The side-by-side summary the demo prints: a column per arm, ratios against dense, and with the
    scheduler's arm a last row comparing it with the fixed one."""
    d, a = c.dense, c.adaptive

    def tta(r: RunResult) -> str:
        if r.tta_s is not None:
            return f"{r.tta_s:.1f} s"
        if r.budget_s is not None:
            return f"> {r.train_s:.0f} s (stopped at its budget, {r.iterations} it)"
        return f"not reached ({r.iterations} it)"

    def faster(exact: float | None, at_least: float | None) -> str:
        if exact is None and at_least is not None:
            return f"≥ {at_least:.2f}× faster (lower bound)"
        return _x(exact, "faster")

    def its(r: RunResult) -> str:
        if r.iters_to_target is not None:
            return str(r.iters_to_target)
        if r is d and c.dense_iters_to_target is not None:
            return f"{c.dense_iters_to_target} (unshaped replay)"
        return "—"

    def same(r: RunResult) -> str:
        return "yes" if r.distinct_final_models == 1 else f"no ({r.distinct_final_models})"

    def per_it(r: RunResult) -> str:
        return _bytes(r.wan_bytes_sent / max(r.iterations, 1))

    arms = c.arms

    def row(label: str, cell: Any, ratios: tuple[str, ...]) -> tuple[str, ...]:
        return (label, *(cell(r) for r in arms), *ratios)

    two = a is None
    rows = [
        row(
            f"time to loss ≤ {d.target_loss:g}",
            tta,
            (faster(c.tta_speedup, c.tta_speedup_at_least),)
            + (() if two else (faster(c.adaptive_tta_speedup, c.adaptive_tta_speedup_at_least),)),
        ),
        row(
            "iterations to target",
            its,
            (_x(c.iters_to_target_ratio, "(wanrt/dense)" if two else ""),)
            + (() if two else (_x(c.adaptive_iters_to_target_ratio, ""),)),
        ),
        row(
            "iterations / s",
            lambda r: f"{r.iters_per_s:.2f}",
            (_x(c.iter_speedup, "faster"),) + (() if two else (_x(c.adaptive_iter_speedup, "faster"),)),
        ),
        row(
            "WAN bytes sent",
            lambda r: _bytes(r.wan_bytes_sent),
            (_x(c.bytes_ratio, "fewer"),) + (() if two else (_x(c.adaptive_bytes_ratio, "fewer"),)),
        ),
        row(
            "WAN bytes / iteration",
            per_it,
            (_x(c.bytes_per_iter_ratio, "fewer"),)
            + (() if two else (_x(c.adaptive_bytes_per_iter_ratio, "fewer"),)),
        ),
        row(
            "final train loss",
            lambda r: f"{r.final_loss:.4f}",
            (_x(c.final_loss_ratio, ""),) + (() if two else (_x(c.adaptive_final_loss_ratio, ""),)),
        ),
        row(
            "loss spike (max / best before)",
            lambda r: "—" if r.loss_spike_ratio is None else f"{r.loss_spike_ratio:.2f}",
            ("",) * (1 if two else 2),
        ),
        row("held-out accuracy", lambda r: f"{100 * r.final_accuracy:.1f} %", ("",) * (1 if two else 2)),
        row("identical final models", same, ("",) * (1 if two else 2)),
    ]
    if a is None:
        head: tuple[str, ...] = ("", ARM_LABELS["dense"], "wanrt", "wanrt vs dense")
    else:
        head = ("", *(ARM_LABELS[r.mode] for r in arms), "fixed vs dense", "adaptive vs dense")
        rows.append(row("density, batch / rank (end)", _settings, ("", "")))
        rows.append(
            row(
                "bandwidth estimate error",
                lambda r: _tracking(r) if r is a else "—",
                ("", ""),
            )
        )
        rows.append(
            row(
                "scheduler decisions",
                lambda r: f"{len(r.commits)} committed" if r is a else "—",
                ("", ""),
            )
        )
        vs = c.adaptive_vs_fixed_tta
        rows.append(
            (
                "adaptive vs fixed: time",
                "",
                "",
                "n/a" if vs is None else (f"{vs:.2f}× faster" if vs >= 1 else f"{1 / vs:.2f}× slower"),
                "",
                "",
            )
        )
    n = len(head)
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(n)]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(head)).rstrip()]
    lines.append("  ".join("-" * wd for wd in widths))
    lines += ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r)).rstrip() for r in rows]
    return "\n".join(lines)


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` atomically (a reader never sees half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
