"""The per-iteration telemetry a site sends its gateway, and the in-site gather it needs.

StellaTrain §4.1: the scheduler estimates the WAN from the trainers' idle time, so the leader reports each
WAN iteration's compute and idle (:class:`~wanrt.client.leader.step_timing.StepTimer`), its batch size and
what ran (density, staleness, ``lr_scale``, the model's size). AntDT §VI-A2's Monitor looks for a straggler
rank *inside* a site, so every rank's batch processing time is gathered on the leader each step (one small
gather at sites of several ranks; every rank takes part, in step order) and summarised
(:func:`wanrt.rank_telemetry.rank_time_metrics`). Iterations pushed empty during a parameter resync are
reported too (the scheduler's ``trainer.resync.empty_pushes``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from wanrt.client.leader.step_timing import StepTimer
from wanrt.client.site.settings_in_force import SettingsInForce
from wanrt.rank_telemetry import rank_time_metrics

__all__ = ["StepReport"]


class StepReport:
    """One rank's part of the telemetry of rank ``rank`` of ``world_size`` (leader: global rank ``dst``)."""

    def __init__(
        self,
        timer: StepTimer,
        group: dist.ProcessGroup | None,
        device: torch.device,
        *,
        rank: int,
        world_size: int,
        dst: int,
    ) -> None:
        self._timer = timer
        self._group = group
        self._device = device
        self._is_leader = rank == 0
        self._world_size = world_size
        self._dst = dst

    def collect(
        self,
        settings: SettingsInForce,
        params: Sequence[torch.Tensor],
        lr_scale: float,
        discarded_steps: int,
        *,
        inner_steps: int | None = None,
    ) -> dict[str, float] | None:
        """Every rank, once per WAN iteration: close the iteration's timing; on the leader, the metrics to
        report (None elsewhere, and for the first iteration, which has no start).

        ``inner_steps``: under an outer loop, the batches its round took (DiLoCo's H, arXiv 2311.08105
        Algorithm 1): the iteration's compute spans them all, so the per-batch times and samples/s divide
        by them (``local_steps`` does not apply there). None: a per-step exchange."""
        bpt = self._timer.bpt()
        times = self.rank_times(-1.0 if bpt is None else bpt)
        cfg = settings.config
        metrics = self._timer.metrics(
            time.monotonic(),
            batch_size=settings.batch_size,
            world_size=self._world_size,
            local_steps=cfg.local_steps if inner_steps is None else 1,
            inner_steps=1 if inner_steps is None else inner_steps,
        )
        if metrics is None or not self._is_leader:
            return None
        if times is not None and min(times) >= 0:
            metrics.update(rank_time_metrics(times))
        metrics["params"] = float(sum(p.numel() for p in params))
        # what ran: the scheduler reads a plan's idle with its payload from the first report on
        metrics["density"] = float(cfg.density)
        metrics["staleness"] = float(cfg.staleness)
        metrics["lr_scale"] = float(lr_scale)  # the scale in force (trainer.lr_scale)
        if discarded_steps:  # the scheduler sees it as trainer.resync.empty_pushes
            metrics["resync.empty_pushes"] = float(discarded_steps)
        return metrics

    def rank_times(self, own: float) -> list[float] | None:
        """Every rank's batch processing time of this iteration, on the leader (one small gather per step
        at sites of several ranks; every rank calls it, in step order)."""
        if self._world_size == 1:
            return [own]
        mine = torch.tensor([own], dtype=torch.float64, device=self._device)
        if not self._is_leader:
            dist.gather(mine, None, dst=self._dst, group=self._group)
            return None
        parts = [torch.zeros(1, dtype=torch.float64, device=self._device) for _ in range(self._world_size)]
        dist.gather(mine, parts, dst=self._dst, group=self._group)
        return [float(p.item()) for p in parts]
