"""ElasticBSP barrier timing (seed 003): when to impose the next synchronisation barrier.

:func:`zipline` is the search the scheduler runs; the paper's other variants and its baselines are here
too, all returning a :class:`BarrierChoice`. :class:`ElasticBarrier` turns push times into plans.
"""

from scheduler.barrier.choice import BarrierChoice
from scheduler.barrier.elastic import METHODS, BarrierConfig, BarrierPlan, ElasticBarrier, predict_ends
from scheduler.barrier.gridscan import full_grid_scan, grid_scan, naive_search
from scheduler.barrier.zipline import zipline, zipline_opt, zipline_opt_bs, zipline_scan

__all__ = [
    "METHODS",
    "BarrierChoice",
    "BarrierConfig",
    "BarrierPlan",
    "ElasticBarrier",
    "full_grid_scan",
    "grid_scan",
    "naive_search",
    "predict_ends",
    "zipline",
    "zipline_opt",
    "zipline_opt_bs",
    "zipline_scan",
]
