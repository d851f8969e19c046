"""The scheduler's sans-IO decision objects (StellaTrain §4.1–4.2): throughput fit, bandwidth estimate,
configuration search, re-planning, density warm-up, staleness, and the policy that composes them.

Everything here is a plain object with time passed in; the scheduler daemon and the simulator drive the same
objects. See docs/scheduler.md.
"""

from scheduler.control.bandwidth import BandwidthEstimator, BandwidthStep
from scheduler.control.config import SchedulerConfig
from scheduler.control.convergence import ConvergenceModel, PowerLawConvergence
from scheduler.control.decision import Decision
from scheduler.control.policy import SchedulerPolicy
from scheduler.control.replan import ReplanPolicy
from scheduler.control.search import Plan, allocate, evaluate_plan, search
from scheduler.control.staleness import StalenessChoice, choose_staleness
from scheduler.control.throughput import ThroughputFit, ThroughputModel, fit_throughput
from scheduler.control.warmup import DensityWarmup

__all__ = [
    "BandwidthEstimator",
    "BandwidthStep",
    "ConvergenceModel",
    "Decision",
    "DensityWarmup",
    "Plan",
    "PowerLawConvergence",
    "ReplanPolicy",
    "SchedulerConfig",
    "SchedulerPolicy",
    "StalenessChoice",
    "ThroughputFit",
    "ThroughputModel",
    "allocate",
    "choose_staleness",
    "evaluate_plan",
    "fit_throughput",
    "search",
]
