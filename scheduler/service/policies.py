"""Which :class:`~scheduler.node.DecisionPolicy` a scheduler runs, from ``[scheduler] policy``."""

from __future__ import annotations

from scheduler.daemon_config import SchedulerDaemonConfig
from scheduler.node import DecisionPolicy, FixedPolicy

__all__ = ["make_policy"]


def make_policy(cfg: SchedulerDaemonConfig) -> DecisionPolicy:
    """``fixed``: settings change only on request (the config's validation admits nothing else yet)."""
    assert cfg.policy == "fixed"
    return FixedPolicy()
