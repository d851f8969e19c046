"""The job's live settings on one rank: what is in force now, and what the scheduler announced for later.

Why one place. The scheduler changes density, staleness, local steps, batch size and weight, the learning
rate's scale and (KILL_RESTART, AntDT §V-E3) a rank's life while the job runs; every rank of every site must
switch at the same WAN iteration, or the sites' parameters part ways. A change travels to the ranks in the
leader's decision (:mod:`wanrt.client.site.decision`) and waits here until its effective iteration; then
:meth:`SettingsInForce.switch` applies every change due, in iteration order: the
:class:`~wanrt.client.config.ClientConfig` in force, the compressor's density, the optimizer's
``lr_scale`` (STAR §IV-C's ADJUST_LR, beside the user's lr), the batch size (the user's callbacks) and the
site's batch weight (its share of the job's samples, ElasticBSP §4). A restart order is returned to the
caller, which owns the process's life. A checkpoint carries these settings (:mod:`wanrt.client.checkpoint`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from wanrt.client.config import ClientConfig
from wanrt.client.site.decision import ConfigChange

__all__ = ["SettingsInForce"]

log = logging.getLogger(__name__)


class _Densities(Protocol):
    def set_density(self, density: float) -> None: ...


class _Scaled(Protocol):
    lr_scale: float


class SettingsInForce:
    """The configuration, batch size and batch weight in force on this rank, and the changes to come."""

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        #: the site's share of the job's samples times the site count (1: equal sites)
        self.batch_weight = 1.0
        #: this rank's batch size as the user set it or the scheduler changed it (None: not told)
        self.batch_size: int | None = None
        #: the outer loop's mode in force (the scheduler's ``outer_steps``/``fragments``/``outer_coding``,
        #: docs/scheduler.md "The mode choice"); None: no decision set it, the trainer's own (wanrt.DiLoCo
        #: then keeps its constructor's H). The outer loop reads them at its next outer step
        self.outer_steps: int | None = None
        self.fragments: int | None = None
        self.outer_coding: str | None = None
        self._batch_callbacks: list[Callable[[int], None]] = []
        self._scheduled: list[ConfigChange] = []

    def on_batch_size(self, callback: Callable[[int], None]) -> None:
        self._batch_callbacks.append(callback)

    def schedule(self, changes: Iterable[ConfigChange]) -> None:
        """Changes the leader's decision carried: each waits for its effective iteration."""
        self._scheduled.extend(changes)

    def switch(
        self, iteration: int, compressor: _Densities | None, optimizer: _Scaled | None
    ) -> ConfigChange | None:
        """Apply every change due at ``iteration`` (late ones too, logged); returns the restart order due,
        if any (a late one is ignored: the rank it named went on)."""
        due = [c for c in self._scheduled if c.effective_iteration <= iteration]
        if not due:
            return None
        restart: ConfigChange | None = None
        self._scheduled = [c for c in self._scheduled if c.effective_iteration > iteration]
        for change in sorted(due, key=lambda c: c.effective_iteration):
            if change.effective_iteration < iteration:
                log.warning(
                    "config change for iteration %d arrived late; applied from iteration %d",
                    change.effective_iteration,
                    iteration,
                )
            updates: dict[str, Any] = {}
            if change.density is not None:
                updates["density"] = change.density
            if change.staleness is not None:
                updates["staleness"] = change.staleness
            if change.local_steps is not None:
                updates["local_steps"] = change.local_steps
            self.config = self.config.with_changes(**updates)
            if compressor is not None:
                compressor.set_density(self.config.density)
            if change.batch_weight is not None:
                self.batch_weight = change.batch_weight
            if change.outer_steps is not None:
                self.outer_steps = change.outer_steps
            if change.fragments is not None:
                self.fragments = change.fragments
            if change.outer_coding is not None:
                self.outer_coding = change.outer_coding
            if change.lr_scale is not None and optimizer is not None:
                # STAR §IV-C's ADJUST_LR: on every rank at the same WAN iteration, beside the user's lr
                optimizer.lr_scale = change.lr_scale
            if change.batch_size is not None:
                self.batch_size = change.batch_size
                for cb in self._batch_callbacks:
                    cb(change.batch_size)
            if change.restart is not None:
                if change.effective_iteration < iteration:
                    log.warning(
                        "restart order for rank %d at iteration %d arrived late (now %d): ignored",
                        change.restart,
                        change.effective_iteration,
                        iteration,
                    )
                else:
                    restart = change
        return restart

    def checkpoint(self) -> dict[str, Any]:
        """The settings a checkpoint records (``SparseOptimizer.state_dict()["settings"]``)."""
        cfg = self.config
        return {
            "density": cfg.density,
            "staleness": cfg.staleness,
            "local_steps": cfg.local_steps,
            "batch_weight": self.batch_weight,
            "outer_steps": self.outer_steps,
            "fragments": self.fragments,
            "outer_coding": self.outer_coding,
        }

    def restore(self, settings: dict[str, Any]) -> None:
        """The settings of a checkpoint (:meth:`checkpoint`) in force from now on."""
        self.config = self.config.with_changes(
            density=settings["density"], staleness=settings["staleness"], local_steps=settings["local_steps"]
        )
        self.batch_weight = float(settings["batch_weight"])
        # checkpoints written before the outer loop's mode existed have none: no decision had set it
        h, f, coding = (settings.get(k) for k in ("outer_steps", "fragments", "outer_coding"))
        self.outer_steps = None if h is None else int(h)
        self.fragments = None if f is None else int(f)
        self.outer_coding = None if coding is None else str(coding)
