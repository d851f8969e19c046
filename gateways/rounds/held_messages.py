"""Peer messages held for a plan this gateway has not adopted yet, bounded per peer.

Why hold them. Gateways learn of a plan change (a site lost or rejoined, a scheduler's new topology) at
different moments, so a peer may already send under the plan this gateway is about to adopt: its message
names a ``plan_id`` that does not match. Dropping it would make the sender's round wait for a re-run;
keeping it until the re-plan (then dispatching it again) lets the round go on. A peer that keeps sending
under a plan that never comes must not grow memory without bound: each peer has ``max_buffered`` slots,
the oldest goes first, and everything below the prune floor goes when the frontier advances. The engine
decides what a held message means once it is dispatched again; this class only keeps them.
"""

from __future__ import annotations

from collections import deque

from gateways.rounds.state import EngineStats
from wanrt.protocol.peer.round_msg import RoundMsg

__all__ = ["HeldMessages"]


class HeldMessages:
    """Per peer, in arrival order, at most ``limit`` messages (counted in ``stats``)."""

    def __init__(self, limit: int, stats: EngineStats) -> None:
        self._limit = limit
        self._stats = stats
        self.queues: dict[str, deque[RoundMsg]] = {}

    def __bool__(self) -> bool:
        return bool(self.queues)

    def hold(self, peer: str, m: RoundMsg) -> None:
        q = self.queues.get(peer)
        if q is None:
            q = self.queues[peer] = deque()
        if len(q) >= self._limit:
            q.popleft()
            self._stats.buffer_dropped += 1
        q.append(m)
        self._stats.buffered += 1

    def forget(self, peer: str) -> None:
        """``peer`` was lost: what it sent for the plan to come is void (it keeps its own contributions)."""
        self.queues.pop(peer, None)

    def take_all(self) -> dict[str, deque[RoundMsg]]:
        """Everything held, to dispatch again under the plan just adopted."""
        held, self.queues = self.queues, {}
        return held

    def take_round(self, key: tuple[int, int]) -> list[tuple[str, RoundMsg]]:
        """The held messages of round ``key`` (per peer, in arrival order), removed; the rest stays."""
        taken: list[tuple[str, RoundMsg]] = []
        for peer, q in list(self.queues.items()):
            if not any((m.iteration, m.layer) == key for m in q):
                continue
            keep: deque[RoundMsg] = deque()
            for m in q:
                if (m.iteration, m.layer) == key:
                    taken.append((peer, m))
                else:
                    keep.append(m)
            self.queues[peer] = keep
        return taken

    def prune(self, floor: int) -> None:
        """Messages of iterations below ``floor`` are settled here: dropped."""
        for peer, q in list(self.queues.items()):
            if q and q[0].iteration < floor:
                fresh = deque(m for m in q if m.iteration >= floor)
                self._stats.buffer_dropped += len(q) - len(fresh)
                self.queues[peer] = fresh
