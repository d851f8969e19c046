"""Which :class:`~scheduler.node.DecisionPolicy` a scheduler runs, from ``[scheduler] policy``."""

from __future__ import annotations

from scheduler.daemon_config import SchedulerDaemonConfig
from scheduler.node import DecisionPolicy, FixedPolicy

__all__ = ["make_policy"]


def make_policy(cfg: SchedulerDaemonConfig) -> DecisionPolicy:
    """``fixed``: settings change only on request. ``adaptive``: StellaTrain's controller over the job's
    sites, with the convergence profile of ``profile`` (or the analytic stand-in)."""
    if cfg.policy == "fixed":
        return FixedPolicy()
    from scheduler.adaptive import AdaptivePolicy
    from scheduler.control.convergence import ConvergenceModel, PowerLawConvergence

    convergence: ConvergenceModel
    if cfg.profile is not None:
        from scheduler.profile.surrogate import ConvergenceProfile

        convergence = ConvergenceProfile.load(cfg.profile)
    else:
        convergence = PowerLawConvergence()
    return AdaptivePolicy(cfg.sites, cfg.control, convergence)
