"""``wanrt profile``: Algorithm 1 of StellaTrain (§4.3) — the convergence penalty ḡ(r, Σx) by Bayesian
optimisation over short probe runs, saved as JSON for the scheduler. The probe that trains the demo's
model (:mod:`wanrt.demo.digits_probe`) and the ``wanrt profile`` command (:mod:`wanrt.demo.profile_cli`)
are the top floor's; this package holds the search, the surrogate and the probe's recipe.

Importing this package imports neither torch nor scikit-learn; they load when a probe runs or a GP is fitted.
"""

from scheduler.profile.acquisition import batch_candidates, choose_batch, expected_improvement
from scheduler.profile.bayesopt import ProbeRecord, ProfileRun, run_profile
from scheduler.profile.config import QUICK, ProfileConfig
from scheduler.profile.probe_settings import ProbeSettings
from scheduler.profile.surrogate import ConvergenceProfile, KernelParams

__all__ = [
    "QUICK",
    "ConvergenceProfile",
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
