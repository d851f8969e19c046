"""Settings of the scheduler daemon's straggler policy (``[scheduler] policy = "stragglers"``), loaded from
the ``[scheduler.stragglers]`` table with its ``detection`` and ``batch`` sub-tables.

Kept apart from :mod:`scheduler.stragglers.daemon_policy` so the daemon's config can name it without
loading the policy's solvers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from scheduler.stragglers.config import BatchConfig, DetectionConfig
from wanrt.config import check

__all__ = ["SiteStragglerConfig"]


@dataclass(frozen=True)
class SiteStragglerConfig:
    """ADJUST_BS across sites, driven by the gateways' telemetry.

    * ``detection`` — AntDT §VI-A2–4's two windows and λ (defaults: the paper's λ = 1.5, 5 and 10 minute
      windows). A job whose iterations take tenths of a second (``wanrt demo``) scales the windows down.
    * ``batch`` — Eq. 3's solver and per-rank bounds; its ``rebalance_gain`` is the least predicted drop
      of the slowest site's batch time that justifies announcing a new split (each announcement costs two
      round trips and a batch change, so noise in the measured throughputs must not trigger one).
    * ``trigger`` — which straggler kind starts ADJUST_BS. AntDT-ND (§VI-A3) adjusts batches for
      *transient* stragglers and kills *persistent* ones; a wanrt site cannot be killed and restarted by the
      scheduler (it is a whole cluster), so a persistent straggler site gets what AntDT-DD (§VI-B) gives
      deterministic stragglers: one ADJUST_BS that equalises batch processing time. ``persistent`` (the
      default) waits for the long window, so a site slow for a moment does not move batches around.
    """

    detection: DetectionConfig = field(default_factory=DetectionConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    trigger: Literal["persistent", "transient"] = "persistent"

    def __post_init__(self) -> None:
        check(self.trigger in ("persistent", "transient"), "trigger", self.trigger, "persistent or transient")
