"""``wanrt profile``: Algorithm 1 of StellaTrain (§4.3) — the convergence penalty ḡ(r, Σx) by Bayesian
optimisation over short probe runs of the demo model, saved as JSON for the scheduler.

Importing this package imports neither torch nor scikit-learn; they load when a probe runs or a GP is fitted.
"""

from scheduler.profile.acquisition import batch_candidates, choose_batch, expected_improvement
from scheduler.profile.bayesopt import ProbeRecord, ProfileRun, run_profile
from scheduler.profile.config import QUICK, ProfileConfig
from scheduler.profile.probe import DigitsProbe, ProbeSettings
from scheduler.profile.surrogate import ConvergenceProfile, KernelParams

__all__ = [
    "QUICK",
    "ConvergenceProfile",
    "DigitsProbe",
    "KernelParams",
    "ProbeRecord",
    "ProbeSettings",
    "ProfileConfig",
    "ProfileRun",
    "batch_candidates",
    "choose_batch",
    "expected_improvement",
    "run_profile",
]
