"""The deadlines of the open rounds: one heap of ``(due, seq, round)`` entries, checked lazily.

Why lazily. A round's deadline moves every time its inputs change (a child arrives, a wait starts), and
removing an entry from the middle of a heap costs O(n); instead the round remembers the one deadline that
is current (``OpenRound.timer``) and an entry whose time is not the round's current one is dropped when it
reaches the top. The engine decides the deadlines (:meth:`RoundEngine._advance`); this class only keeps
them in order. Sans-IO: the times are the ``now`` values the engine is given, never a clock read here.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping

from gateways.rounds.actions import PeerSuspect
from gateways.rounds.state import OpenRound

__all__ = ["Key", "RoundTimers"]

Key = tuple[int, int]


class RoundTimers:
    """Deadlines of rounds ``(iteration, layer)``, earliest first; stale entries are skipped.

    Beside the gather deadline the engine computes, a round that waits on a peer (``wait_peer``: the
    parent's result, the ring's predecessor, an all-pairs member) is due once that peer was silent for
    ``suspect_after_s``: the engine then reports it (:class:`~gateways.rounds.actions.PeerSuspect`) and the
    daemon may declare it lost, which re-runs the round without it."""

    def __init__(self, suspect_after_s: float) -> None:
        self._suspect_after_s = suspect_after_s
        self._heap: list[tuple[float, int, Key]] = []
        self._seq = 0  # ties broken by arming order, so equal deadlines fire in a fixed order

    def rearm(self, r: OpenRound, gather_at: float | None) -> None:
        """Make ``r``'s deadline the earlier of ``gather_at`` and its wait's suspect time (if any)."""
        due = gather_at
        if r.wait_peer is not None and not r.suspected:
            t = r.wait_since + self._suspect_after_s
            due = t if due is None else min(due, t)
        if due != r.timer:
            r.timer = due
            if due is not None:
                self.arm((r.iteration, r.layer), due)

    def suspect(self, r: OpenRound, now: float) -> PeerSuspect | None:
        """At ``r``'s deadline: the peer it waits on, if silent for ``suspect_after_s`` (reported once)."""
        if r.wait_peer is None or r.suspected or now < r.wait_since + self._suspect_after_s:
            return None
        r.suspected = True
        return PeerSuspect(r.wait_peer, r.iteration, r.layer, now - r.wait_since, r.wait_reason)

    def arm(self, key: Key, due: float) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (due, self._seq, key))

    def expired(self, now: float, rounds: Mapping[Key, OpenRound]) -> Iterator[OpenRound]:
        """The ``rounds`` whose current deadline is at or before ``now``, earliest first, their deadline
        cleared (entries that are no longer a round's deadline are dropped on the way)."""
        while self._heap and self._heap[0][0] <= now:
            t, _, key = heapq.heappop(self._heap)
            r = rounds.get(key)
            if r is not None and r.timer == t:
                r.timer = None
                yield r

    def next(self, rounds: Mapping[Key, OpenRound]) -> float | None:
        """The earliest current deadline of ``rounds`` (``None``: none); stale entries are dropped."""
        while self._heap:
            t, _, key = self._heap[0]
            r = rounds.get(key)
            if r is not None and r.timer == t:
                return t
            heapq.heappop(self._heap)
        return None
