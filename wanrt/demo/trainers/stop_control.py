"""Stopping every trainer of every site at the same iteration, without a race.

Sites run up to the staleness bound apart, and a site that stops early leaves the others waiting for its
pushes, so "stop now" is not enough: all trainers must stop *before the same iteration* T. Each run has two
shared counters under one lock: ``stop_at`` (initially ``max_iters``) and ``started`` (the highest iteration
any trainer has begun). A trainer asks :meth:`StopControl.may_start` before each iteration ``i``; the parent,
once the target is reached, sets ``stop_at = started + 1``. Because both happen under the lock, no trainer
can have begun an iteration ≥ T, and every trainer, however far behind, runs exactly iterations 0..T-1.
"""

from __future__ import annotations

from multiprocessing.context import BaseContext
from typing import Any

__all__ = ["StopControl"]


class StopControl:
    """Per-run ``[stop_at, started]`` pairs in shared memory (create in the parent, pass to the children)."""

    def __init__(self, mp: BaseContext, runs: int) -> None:
        self._runs = runs
        self._cells: Any = mp.Array("q", 2 * runs, lock=True)

    def arm(self, slot: int, max_iters: int) -> None:
        """Before a run starts: it may run ``max_iters`` iterations, none has begun."""
        with self._cells.get_lock():
            self._cells[2 * slot] = max_iters
            self._cells[2 * slot + 1] = -1

    def may_start(self, slot: int, iteration: int) -> bool:
        """Trainer: may I begin ``iteration`` (0-based)? Records that it began if so."""
        with self._cells.get_lock():
            if iteration >= self._cells[2 * slot]:
                return False
            if iteration > self._cells[2 * slot + 1]:
                self._cells[2 * slot + 1] = iteration
            return True

    def stop_soon(self, slot: int) -> int:
        """Parent: stop every trainer after the furthest iteration any has begun; returns that count T."""
        with self._cells.get_lock():
            stop_at = min(int(self._cells[2 * slot]), int(self._cells[2 * slot + 1]) + 1)
            self._cells[2 * slot] = stop_at
            return stop_at

    def stop_at(self, slot: int) -> int:
        with self._cells.get_lock():
            return int(self._cells[2 * slot])
