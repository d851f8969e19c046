"""The simulator's clock: a heap of ``(time, seq, callback, args)`` tuples, run in order.

Why ``seq``: events due at the same virtual time run in the order they were scheduled, so a run is a pure
function of its inputs and seed (heap order alone would compare callbacks, or depend on insertion history).
Why plain tuples: a 1 000-site round schedules ~7 000 events; an object per event (and a cancelled flag
checked per pop) was a few per cent of a round. Nothing cancels events: a callback that may have been
superseded checks that itself (``Simulation._tick``, ``Simulation._paced``).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import Any, Final

from wanrt.errors import WanrtError

__all__ = ["EventLoop", "SimulationStuck"]

#: Events at one instant after which the loop gives up: a callback that keeps re-scheduling itself at the
#: same time is a livelock in the driver, and a simulation must end with an error, not hang.
MAX_EVENTS_AT_ONE_TIME: Final = 10_000_000


class SimulationStuck(WanrtError):
    """The event loop cannot make progress (a livelock at one instant, or the virtual-time limit)."""


class EventLoop:
    """Virtual time; ``now`` only moves forward, to the time of the event being run."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = 0
        self.events_run = 0

    def at(self, time: float, callback: Callable[..., Any], *args: Any) -> None:
        """Run ``callback(*args)`` at ``time`` (never before now: the past is clamped to now)."""
        if time < self.now:
            time = self.now
        self._seq += 1
        heapq.heappush(self._heap, (time, self._seq, callback, args))

    def after(self, delay: float, callback: Callable[..., Any], *args: Any) -> None:
        self.at(self.now + delay, callback, *args)

    def pending(self) -> int:
        return len(self._heap)

    def run(self, until: float = math.inf, stop: Callable[[], bool] | None = None) -> None:
        """Run events until none are left, the next is after ``until``, or ``stop()`` is true."""
        heap = self._heap
        pop = heapq.heappop
        same_time = 0
        run = 0
        try:
            while heap:
                if heap[0][0] > until:
                    self.now = until
                    return
                t, _, callback, args = pop(heap)
                if t == self.now:
                    same_time += 1
                    if same_time > MAX_EVENTS_AT_ONE_TIME:
                        raise SimulationStuck(f"more than {MAX_EVENTS_AT_ONE_TIME} events at t={t}")
                else:
                    same_time = 0
                    self.now = t
                run += 1
                callback(*args)
                if stop is not None and stop():
                    return
        finally:
            self.events_run += run
