"""Which :class:`~scheduler.node.DecisionPolicy` a scheduler runs, from ``[scheduler] policy``."""

from __future__ import annotations

from scheduler.daemon_config import SchedulerDaemonConfig
from scheduler.node import DecisionPolicy, FixedPolicy

__all__ = ["make_policy"]


def make_policy(cfg: SchedulerDaemonConfig) -> DecisionPolicy:
    """``fixed``: settings change only on request. ``adaptive``: StellaTrain's controller over the job's
    sites, with the convergence profile of ``profile`` (or the analytic stand-in). ``stragglers``: AntDT's
    ADJUST_BS across sites (a persistent straggler site gets Eq. 3's split; density and staleness stay as
    the trainers started), with ``[scheduler.stragglers]``."""
    if cfg.policy == "fixed":
        return FixedPolicy()
    if cfg.policy == "stragglers":
        from scheduler.stragglers.daemon_policy import SiteStragglerPolicy

        return SiteStragglerPolicy(cfg.sites, cfg.stragglers)
    from scheduler.adaptive import AdaptivePolicy
    from scheduler.control.convergence import ConvergenceModel, PowerLawConvergence

    convergence: ConvergenceModel
    if cfg.profile is not None:
        from scheduler.profile.surrogate import ConvergenceProfile

        convergence = ConvergenceProfile.load(cfg.profile)
    else:
        c = cfg.control
        convergence = PowerLawConvergence.from_critical_batch(
            c.standin_critical_batch,
            c.standin_batch_ref,
            fixed_lr=c.standin_fixed_lr,
            density_coef=c.standin_density_coef,
            density_exponent=c.standin_density_exponent,
        )
    adaptive = AdaptivePolicy(cfg.sites, cfg.control, convergence)
    if cfg.mode.enabled:  # the exchange mode chosen beside (docs/scheduler.md, "The mode choice")
        from scheduler.mode_policy import ModePolicy

        return ModePolicy(cfg.sites, adaptive, cfg.mode)
    return adaptive
