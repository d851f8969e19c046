"""ElasticBSP's barrier planner as a sans-IO object: push times in, the next barrier out (seed 003, §3–4).

The server learns each worker's iteration interval from its two latest push times (the *monitoring phase*,
Fig. 5), predicts its next R ends as ``t_last + j·interval`` (j = 1..R, §4: "a stable environment"),
and asks a search method (ZipLine by default) for the barrier with the least waiting. Every plan uses only
the most recent pushes, so a wrong prediction is not carried into the next superstep (§4).
Time is passed in; nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

import numpy as np
import numpy.typing as npt

from scheduler.barrier.choice import BarrierChoice
from scheduler.barrier.gridscan import full_grid_scan, grid_scan
from scheduler.barrier.zipline import zipline, zipline_opt, zipline_opt_bs, zipline_scan
from wanrt.config import check
from wanrt.errors import LocalProtocolError

__all__ = ["METHODS", "BarrierConfig", "BarrierPlan", "ElasticBarrier", "Method", "predict_ends"]

Method: TypeAlias = Literal[
    "zipline", "zipline_scan", "zipline_opt", "zipline_opt_bs", "grid_scan", "full_grid_scan"
]
METHODS: Final[dict[str, Callable[[npt.ArrayLike], BarrierChoice]]] = {
    "zipline": zipline,
    "zipline_scan": zipline_scan,
    "zipline_opt": zipline_opt,
    "zipline_opt_bs": zipline_opt_bs,
    "grid_scan": grid_scan,
    "full_grid_scan": full_grid_scan,
}

#: The paper's largest lookahead is R = 960 (§6.2.3, VGG-16); beyond a few thousand the prediction
#: "stable for R iterations" means nothing and the search arrays grow for no benefit.
MAX_LOOKAHEAD: Final = 4096


@dataclass(frozen=True)
class BarrierConfig:
    """``lookahead`` R = 15 is the paper's SmallR setting (Table 2, §6.2.1's default for small models)."""

    lookahead: int = 15
    method: Method = "zipline"

    def __post_init__(self) -> None:
        check(1 <= self.lookahead <= MAX_LOOKAHEAD, "lookahead", self.lookahead, f"1..{MAX_LOOKAHEAD}")
        check(self.method in METHODS, "method", self.method, f"one of {sorted(METHODS)}")


@dataclass(frozen=True)
class BarrierPlan:
    """The next barrier: at ``t_sync``, after ``iterations[w]`` more local steps of each worker w."""

    t_sync: float
    wait: float
    iterations: dict[Hashable, int]
    total_wait: float


def predict_ends(last: npt.ArrayLike, interval: npt.ArrayLike, lookahead: int) -> npt.NDArray[np.float64]:
    """§4: worker p's j-th future end is ``last_p + j·interval_p`` (an n × R matrix)."""
    steps = np.arange(1, lookahead + 1, dtype=np.float64)
    return (
        np.asarray(last, dtype=np.float64)[:, None] + np.asarray(interval, dtype=np.float64)[:, None] * steps
    )


class ElasticBarrier:
    """Plans ElasticBSP barriers from the workers' push times."""

    def __init__(self, workers: Iterable[Hashable], cfg: BarrierConfig | None = None) -> None:
        self.cfg = cfg or BarrierConfig()
        self._pushes: dict[Hashable, tuple[float | None, float | None]] = {w: (None, None) for w in workers}

    def observe_push(self, worker: Hashable, t: float) -> None:
        """A push (end of one iteration) from ``worker`` at time ``t``."""
        if worker not in self._pushes:
            raise LocalProtocolError("unknown worker", peer=str(worker))
        _, last = self._pushes[worker]
        if not math.isfinite(t) or (last is not None and t < last):
            raise LocalProtocolError(
                "push times must be finite and non-decreasing", peer=str(worker), value=t
            )
        self._pushes[worker] = (last, t)

    def ready(self) -> bool:
        """True once every worker has pushed twice (the monitoring phase is over)."""
        return all(prev is not None for prev, _ in self._pushes.values())

    def plan(self) -> BarrierPlan | None:
        """The next barrier, or None while some worker's interval is still unknown."""
        if not self.ready():
            return None
        workers = list(self._pushes)
        last = np.array([self._pushes[w][1] for w in workers], dtype=np.float64)
        prev = np.array([self._pushes[w][0] for w in workers], dtype=np.float64)
        ends = predict_ends(last, last - prev, self.cfg.lookahead)
        choice = METHODS[self.cfg.method](ends)
        return BarrierPlan(
            t_sync=choice.t_sync,
            wait=choice.wait,
            iterations=dict(zip(workers, choice.iterations, strict=True)),
            total_wait=choice.total_wait,
        )
