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
from typing import Final

from wanrt.protocol.peer.contrib_ids import ContribIds, id_groups
from wanrt.protocol.peer.round_msg import ContribId

__all__ = ["SMALL_GROUP", "CountedLog", "IterationRanges"]


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


#: An iteration's group of sites in a result up to this size is recorded per site; a larger one (a result
#: naming most of a many-site job) as part of a run shared by every site of the group.
SMALL_GROUP: Final = 8


@dataclass(slots=True)
class _Run:
    """Consecutive iterations [lo, hi) whose results each counted every site of ``sites`` (interned)."""

    lo: int
    hi: int
    sites: frozenset[str]


class CountedLog:
    """Per (site, layer), the iterations of that site counted in results seen here (module docstring).

    ``since``: the first iteration whose results this log saw (the engine's start); ``skip``: a site whose
    contributions need no record (this gateway's own: it is never told its own outcome).

    Two stores, one answer. An iteration's group of more than :data:`SMALL_GROUP` sites extends the
    layer's last *run* when it is the next iteration and the same (interned) site set, else starts a run:
    O(1) per result whatever the job's size. Recording every id of every result per site instead was
    O(sites) per result at every gateway — 1 000 id updates per round at each of a simulated 1 000-site
    tree's gateways, 0.4 s of a 0.65 s simulated round. Small groups, and groups older than the newest
    run (a late result), go to per-site :class:`IterationRanges`. Both are bounded by ``max_ranges``.
    """

    def __init__(self, since: int, max_ranges: int, skip: str | None = None) -> None:
        self.since = since
        self.max_ranges = max_ranges
        self._skip = skip
        self._ranges: dict[tuple[str, int], IterationRanges] = {}
        self._runs: dict[int, list[_Run]] = {}
        self._runs_since: dict[int, int] = {}  # per layer: from which iteration its runs are exact

    def add(self, layer: int, ids: Iterable[ContribId]) -> None:
        """A result of ``layer`` counted ``ids``."""
        groups = ids.groups() if isinstance(ids, ContribIds) else id_groups(ids)
        for it, sites in groups:
            if len(sites) > SMALL_GROUP and self._add_run(layer, it, sites):
                continue
            for site in sites:
                if site == self._skip:
                    continue
                r = self._ranges.get((site, layer))
                if r is None:
                    r = self._ranges[(site, layer)] = IterationRanges(self.since, self.max_ranges)
                r.add(it)

    def _add_run(self, layer: int, it: int, sites: frozenset[str]) -> bool:
        """Record (it, sites) in the layer's runs; False if it is older than the newest run (per site)."""
        runs = self._runs.get(layer)
        if runs is None:
            runs = self._runs[layer] = []
        last = runs[-1] if runs else None
        if last is not None and it < last.hi:
            return False
        if last is not None and last.hi == it and (last.sites is sites or last.sites == sites):
            last.hi = it + 1
            return True
        runs.append(_Run(it, it + 1, sites))
        if len(runs) > self.max_ranges:  # forget the oldest run: below its end nothing is known any more
            old = runs.pop(0)
            self._runs_since[layer] = max(self._runs_since.get(layer, self.since), old.hi)
        return True

    def counted(self, site: str, layer: int, until: int, limit: int) -> tuple[int, tuple[int, ...]]:
        """What an ``outcome`` for ``site`` and ``layer`` says: (since, iterations counted below
        ``until``, ascending), at most ``limit`` of them, the newest (a rejoining site needs the ones from
        just before it left); every counted iteration in [since, until) is listed."""
        r = self._ranges.get((site, layer))
        since_a, a = (self.since, []) if r is None else r.newest_below(until, limit)
        since_b, b = self._run_iterations(site, layer, until, limit)
        since = max(since_a, since_b)
        newest = sorted(set(a) | set(b), reverse=True)
        if len(newest) > limit:
            newest = newest[:limit]
            since = max(since, newest[-1])
        return min(since, until), tuple(it for it in reversed(newest) if it >= since)

    def _run_iterations(self, site: str, layer: int, until: int, limit: int) -> tuple[int, list[int]]:
        """Like :meth:`IterationRanges.newest_below`, over the layer's runs that counted ``site``."""
        since = self._runs_since.get(layer, self.since)
        out: list[int] = []
        for run in reversed(self._runs.get(layer, ())):
            if run.lo >= until or site not in run.sites:
                continue
            for it in range(min(run.hi, until) - 1, run.lo - 1, -1):
                if len(out) == limit:
                    return max(since, out[-1]), out
                out.append(it)
        return since, out

    def layers(self) -> set[int]:
        return {layer for _, layer in self._ranges} | {layer for layer, runs in self._runs.items() if runs}

    def ranges(self) -> int:
        """Ranges and runs held in all (memory accounting, tests)."""
        return sum(len(r) for r in self._ranges.values()) + sum(len(r) for r in self._runs.values())
