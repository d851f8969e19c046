"""The simulator's clock: a heap of ``(time, seq, callback)``, run in order.

Why ``seq``: events due at the same virtual time run in the order they were scheduled, so a run is a pure
function of its inputs and seed (heap order alone would compare callbacks, or depend on insertion history).
Cancelled events stay in the heap and are skipped when popped (cheaper than removing them).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import Any, Final

from wanrt.errors import WanrtError

__all__ = ["Event", "EventLoop", "SimulationStuck"]

#: Events at one instant after which the loop gives up: a callback that keeps re-scheduling itself at the
#: same time is a livelock in the driver, and a simulation must end with an error, not hang.
MAX_EVENTS_AT_ONE_TIME: Final = 10_000_000


class SimulationStuck(WanrtError):
    """The event loop cannot make progress (a livelock at one instant, or the virtual-time limit)."""


class Event:
    """A scheduled callback; :meth:`cancel` makes the loop skip it."""

    __slots__ = ("args", "callback", "cancelled", "time")

    def __init__(self, time: float, callback: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.time = time
        self.callback = callback
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class EventLoop:
    """Virtual time; ``now`` only moves forward, to the time of the event being run."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Event]] = []
        self._seq = 0
        self.events_run = 0

    def at(self, time: float, callback: Callable[..., Any], *args: Any) -> Event:
        """Run ``callback(*args)`` at ``time`` (never before now: the past is clamped to now)."""
        if time < self.now:
            time = self.now
        ev = Event(time, callback, args)
        self._seq += 1
        heapq.heappush(self._heap, (time, self._seq, ev))
        return ev

    def after(self, delay: float, callback: Callable[..., Any], *args: Any) -> Event:
        return self.at(self.now + delay, callback, *args)

    def pending(self) -> int:
        return len(self._heap)

    def run(self, until: float = math.inf, stop: Callable[[], bool] | None = None) -> None:
        """Run events until none are left, the next is after ``until``, or ``stop()`` is true."""
        heap = self._heap
        pop = heapq.heappop
        same_time = 0
        while heap:
            t, _, ev = heap[0]
            if t > until:
                self.now = until
                return
            pop(heap)
            if ev.cancelled:
                continue
            if t == self.now:
                same_time += 1
                if same_time > MAX_EVENTS_AT_ONE_TIME:
                    raise SimulationStuck(f"more than {MAX_EVENTS_AT_ONE_TIME} events at t={t}")
            else:
                same_time = 0
            self.now = t
            self.events_run += 1
            ev.callback(*ev.args)
            if stop is not None and stop():
                return
