"""Straggler detection and mitigation policies (sans-IO): AntDT (seed 001), STAR (seed 000), seed 002.

:class:`~scheduler.stragglers.daemon_policy.SiteStragglerPolicy` is the entry point the scheduler daemon
drives (``policy = "stragglers"``, :func:`scheduler.service.policies.make_policy`); the pieces (detectors,
Eq. 3/4 allocators, the noise-scale estimator, STAR's mode model, the latency tree, rank restarts) are
usable on their own. The whole-cluster :class:`~sims.policies.straggler_policy.StragglerPolicy` runs only
in simulations and lives beside the simulator. See docs/stragglers.md.
"""

from scheduler.stragglers.batch_alloc import (
    AccumulationPlan,
    DeviceGroup,
    allocate_accumulation,
    allocate_continuous,
    allocate_greedy,
    allocate_milp,
    makespan,
)
from scheduler.stragglers.config import (
    BatchConfig,
    DetectionConfig,
    LinkConfig,
    ModeConfig,
    NoiseConfig,
    PolicyConfig,
)
from scheduler.stragglers.decisions import (
    Action,
    AdjustBatch,
    AdjustLr,
    BackupWorkers,
    KillRestart,
    NoAction,
    ParentChild,
    StragglerDecision,
    TreeRebuild,
)
from scheduler.stragglers.detection import (
    DetectionReport,
    LinkReport,
    LinkSlowdownDetector,
    MemberStatus,
    StragglerDetector,
)
from scheduler.stragglers.noise_scale import NoiseScale
from scheduler.stragglers.star_modes import (
    ModeChoice,
    brute_force_mode,
    choose_mode,
    scaled_lr,
    tw_sweep,
)
from scheduler.stragglers.tree import latency_tree, tree_depths

__all__ = [
    "AccumulationPlan",
    "Action",
    "AdjustBatch",
    "AdjustLr",
    "BackupWorkers",
    "BatchConfig",
    "DetectionConfig",
    "DetectionReport",
    "DeviceGroup",
    "KillRestart",
    "LinkConfig",
    "LinkReport",
    "LinkSlowdownDetector",
    "MemberStatus",
    "ModeChoice",
    "ModeConfig",
    "NoAction",
    "NoiseConfig",
    "NoiseScale",
    "ParentChild",
    "PolicyConfig",
    "StragglerDecision",
    "StragglerDetector",
    "TreeRebuild",
    "allocate_accumulation",
    "allocate_continuous",
    "allocate_greedy",
    "allocate_milp",
    "brute_force_mode",
    "choose_mode",
    "latency_tree",
    "makespan",
    "scaled_lr",
    "tree_depths",
    "tw_sweep",
]
