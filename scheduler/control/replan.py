"""When to run the configuration search again (StellaTrain §4.1 re-plans "periodically" from telemetry).

A plan is announced to every site and takes effect at a common iteration, so re-planning on every
telemetry message would churn configurations for nothing. Re-plan when:

* there is no plan yet (``"initial"``);
* the bandwidth estimate moved by ``replan_bandwidth_change`` or more relative to the one the current
  plan used (``"bandwidth_change"``): Eq. 6 ties r to B, and the estimate's feedback loop needs the payload
  to follow the estimate to learn anything;
* the exchange latency L (ours, :mod:`scheduler.control.latency`) moved by ``replan_latency_change``
  or more relative to the one the plan used (``"latency_change"``): with the latency on, L paces the
  iteration and sizes the batch and payload as B does (in the demo, without it a plan made from the first
  seconds' L ran the whole job: the estimate sat at its prior, so nothing else re-planned);
* ``replan_period_s`` has passed (``"periodic"``): the throughput fits drift slowly;

and never twice within ``replan_min_interval_s``.
"""

from __future__ import annotations

from typing import Literal

from scheduler.control.config import SchedulerConfig

__all__ = ["ReplanPolicy", "ReplanReason"]

ReplanReason = Literal["initial", "bandwidth_change", "latency_change", "periodic"]


class ReplanPolicy:
    """Says when to search again; :meth:`planned` records that a plan was made."""

    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.cfg = config if config is not None else SchedulerConfig()
        self._last_time: float | None = None
        self._last_bw: float | None = None
        self._last_latency = 0.0

    def reason(self, now: float, bandwidth_bps: float, latency_s: float = 0.0) -> ReplanReason | None:
        """Why a new plan is due at ``now`` with the current estimate; None: keep the current one."""
        if self._last_time is None or self._last_bw is None:
            return "initial"
        since = now - self._last_time
        if since < self.cfg.replan_min_interval_s:
            return None
        if abs(bandwidth_bps / self._last_bw - 1.0) >= self.cfg.replan_bandwidth_change:
            return "bandwidth_change"
        ref = self._last_latency
        if latency_s > 0 and (ref <= 0 or abs(latency_s / ref - 1.0) >= self.cfg.replan_latency_change):
            return "latency_change"
        if since >= self.cfg.replan_period_s:
            return "periodic"
        return None

    def planned(self, now: float, bandwidth_bps: float, latency_s: float = 0.0) -> None:
        self._last_time = now
        self._last_bw = bandwidth_bps
        self._last_latency = latency_s
