"""A site's trainers, reduced to what the gateway sees: pushes after compute, aggregates back.

Iteration ``i`` starts when the site's compute for ``i - 1`` is done and every aggregate of iteration
``i - 1 - staleness`` has arrived (staleness 0: synchronous; 1: StellaTrain §3.3's partial staleness,
the next iteration's compute overlaps the previous one's communication). During an iteration the layers
are pushed last-first across the backward pass (``backward_fraction`` of the compute time; 0 = all at
the end), as a backward pass produces them. Each Aggregate is acknowledged at once (the site leader's
``Ack``); its payload digest is kept for comparisons.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["TrainerState"]


@dataclass(slots=True)
class TrainerState:
    """One site's trainer progress (the simulation drives it; see the module docstring)."""

    site: str
    index: int
    layers: int
    iterations: int
    staleness: int
    computing: int | None = None  # the iteration being computed
    computed: int = -1  # newest iteration whose compute ended
    complete_through: int = -1  # every aggregate of iterations <= this arrived
    got: dict[int, int] = field(default_factory=dict)  # iteration -> aggregates arrived
    started: list[float] = field(default_factory=list)  # start time of each iteration
    completed: dict[int, float] = field(default_factory=dict)  # iteration -> last aggregate's time
    held: list[tuple[int, int]] = field(default_factory=list)  # pushes waiting for the gateway to join

    @property
    def finished(self) -> bool:
        return self.complete_through >= self.iterations - 1

    def aggregate(self, iteration: int, now: float) -> bool:
        """An aggregate of ``iteration`` arrived; True if that completed more iterations."""
        n = self.got.get(iteration, 0) + 1
        self.got[iteration] = n
        if n < self.layers:
            return False
        self.completed[iteration] = now
        advanced = False
        while self.got.get(self.complete_through + 1, 0) >= self.layers:
            self.complete_through += 1
            self.got.pop(self.complete_through, None)
            advanced = True
        return advanced

    def next_ready(self) -> int | None:
        """The iteration that may start now, if any."""
        nxt = self.computed + 1
        if self.computing is not None or nxt >= self.iterations:
            return None
        if self.complete_through < nxt - 1 - self.staleness:
            return None
        return nxt
