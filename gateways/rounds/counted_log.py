"""Which contributions of each site the results seen here counted, as ranges of iterations (sans-IO).

A site that rejoins after a restart or a long cut is told by every peer, per layer, which of its
contributions ``(site, iteration)`` the results counted (``outcome`` messages of
:mod:`gateways.rounds.engine`); what no peer can speak for (older than the peer's record) is carried by its
ledger, possibly counted twice. The record used to be the contribution ids of every result of the last
``outcome_history`` (64) iterations, about 2.5 KB per (iteration, layer) with the ids' cached derived
values: a gateway down for 5 s at 10 iterations a second came back 50–75 iterations behind, past it (chaos
soak, full seed 2: 3 pushes lost, 1 counted twice), and 256 iterations of it cost 30 MB of RSS more.

A site's counted iterations of a layer are nearly one contiguous run: a push missing its round is carried
and counted later under its own id, so only an outage (or a push the ledger folded into a later one) leaves
a gap. :class:`CountedLog` keeps, per (site, layer), the counted iterations as disjoint ranges — two ints
per run of iterations, whatever the job's pace — from the engine's start on, so a rejoining site is
answered however long it was away. Bounded by ``max_ranges`` ranges per (site, layer): past that the oldest
range is forgotten and the record for that (site, layer) starts after it (its ``since``).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field

from gateways.rounds.messages import ContribId

__all__ = ["CountedLog", "IterationRanges"]


@dataclass(slots=True)
class IterationRanges:
    """A set of iterations as disjoint, sorted ranges [lo[i], hi[i]); exact from ``since`` on. At most
    ``max_ranges`` ranges: past that the oldest is forgotten (and ``since`` moves past it). Iterations a
    gateway records (counted, answered) come nearly in order without gaps, so this is a few ints where a
    ``set`` of the same iterations held 60 bytes for each."""

    since: int
    max_ranges: int
    lo: list[int] = field(default_factory=list)
    hi: list[int] = field(default_factory=list)

    def __contains__(self, it: int) -> bool:
        i = bisect_right(self.lo, it) - 1
        return i >= 0 and it < self.hi[i]

    def add(self, it: int) -> bool:
        """Record ``it``; False if it was recorded already."""
        lo, hi = self.lo, self.hi
        i = bisect_right(lo, it) - 1
        if i >= 0 and it < hi[i]:
            return False
        left = i >= 0 and hi[i] == it
        right = i + 1 < len(lo) and lo[i + 1] == it + 1
        if left and right:
            hi[i] = hi[i + 1]
            del lo[i + 1], hi[i + 1]
        elif left:
            hi[i] = it + 1
        elif right:
            lo[i + 1] = it
        else:
            lo.insert(i + 1, it)
            hi.insert(i + 1, it + 1)
            if len(lo) > self.max_ranges:
                # forget the oldest run: below its end nothing is known any more (iterations in the gap
                # after it are still known not to be in the set)
                self.since = max(self.since, hi[0])
                del lo[0], hi[0]
        return True

    def newest_below(self, until: int, limit: int) -> tuple[int, list[int]]:
        """Up to ``limit`` iterations below ``until``, newest first, and the iteration from which that
        list is complete (``since``, or the oldest listed when ``limit`` cut it)."""
        out: list[int] = []
        i = bisect_right(self.lo, until - 1) - 1
        while i >= 0:
            top = min(self.hi[i], until)
            for it in range(top - 1, self.lo[i] - 1, -1):
                if len(out) == limit:
                    return max(self.since, out[-1]), out
                out.append(it)
            i -= 1
        return self.since, out

    def __len__(self) -> int:
        """Ranges held (memory accounting)."""
        return len(self.lo)


class CountedLog:
    """Per (site, layer), the iterations of that site counted in results seen here (module docstring).

    ``since``: the first iteration whose results this log saw (the engine's start); ``skip``: a site whose
    contributions need no record (this gateway's own: it is never told its own outcome).
    """

    def __init__(self, since: int, max_ranges: int, skip: str | None = None) -> None:
        self.since = since
        self.max_ranges = max_ranges
        self._skip = skip
        self._ranges: dict[tuple[str, int], IterationRanges] = {}

    def add(self, layer: int, ids: Iterable[ContribId]) -> None:
        """A result of ``layer`` counted ``ids``."""
        for site, it in ids:
            if site == self._skip:
                continue
            r = self._ranges.get((site, layer))
            if r is None:
                r = self._ranges[(site, layer)] = IterationRanges(self.since, self.max_ranges)
            r.add(it)

    def counted(self, site: str, layer: int, until: int, limit: int) -> tuple[int, tuple[int, ...]]:
        """What an ``outcome`` for ``site`` and ``layer`` says: (since, iterations counted below
        ``until``, ascending), at most ``limit`` of them, the newest (a rejoining site needs the ones from
        just before it left); every counted iteration in [since, until) is listed."""
        r = self._ranges.get((site, layer))
        if r is None:
            return min(self.since, until), ()
        since, its = r.newest_below(until, limit)
        return min(since, until), tuple(reversed(its))

    def layers(self) -> set[int]:
        return {layer for _, layer in self._ranges}

    def ranges(self) -> int:
        """Ranges held in all (memory accounting, tests)."""
        return sum(len(r) for r in self._ranges.values())
