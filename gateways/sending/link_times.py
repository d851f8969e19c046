"""Per-iteration link times, measured per peer, for the rate allocator (seed 002's T_flow_i).

A round ends when its slowest link finishes, so the allocator wants, for each finished iteration, how long
each link took to carry that iteration's messages. Measured at the sender without any clock agreement:
from the moment the first message of iteration i left for peer p (its first chunk was written) to the
moment p acknowledged the last one (cumulative ``Ack`` s, sent once p's gateway has taken the messages). It
includes queueing behind other traffic, transmission at the paced rate and the round trip, which is what a
straggling link makes long.

An iteration is reported once the local frontier is ``settle`` iterations past it (its messages are all
out by then); a peer still owing acknowledgements counts with the time elapsed so far. A peer whose link
goes down is left out. Sans-IO: times are passed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["MAX_OUTSTANDING", "LinkTimes"]

#: Messages per peer awaiting acknowledgement before the oldest are forgotten (their measurement lost): a
#: peer that never acknowledges must not make the sender's bookkeeping grow without bound.
MAX_OUTSTANDING: Final = 1 << 16


@dataclass(slots=True)
class _Span:
    start: float
    end: float
    outstanding: int


class LinkTimes:
    """Collects spans per (iteration, peer) and hands out finished iterations in increasing order."""

    def __init__(self, settle: int) -> None:
        self.settle = settle
        self._spans: dict[int, dict[str, _Span]] = {}
        self._seqs: dict[str, dict[int, int]] = {}
        self._reported = -1

    def sent(self, peer: str, seq: int, iteration: int, now: float) -> None:
        """Message ``seq`` of ``iteration`` started leaving for ``peer``."""
        seqs = self._seqs.setdefault(peer, {})
        if len(seqs) >= MAX_OUTSTANDING:
            del seqs[next(iter(seqs))]
        seqs[seq] = iteration
        if iteration <= self._reported:
            return  # a late reply for a reported iteration (e.g. a final re-sent to a rejoining peer)
        span = self._spans.setdefault(iteration, {}).get(peer)
        if span is None:
            self._spans[iteration][peer] = _Span(now, now, 1)
        else:
            span.outstanding += 1

    def acked_through(self, peer: str, seq: int, now: float) -> int:
        """``peer`` took every message up to ``seq`` (a cumulative ack); returns how many were outstanding."""
        seqs = self._seqs.get(peer)
        if not seqs:
            return 0
        done = [s for s in seqs if s <= seq]  # sending order is EDF order, not sequence order
        for s in done:
            iteration = seqs.pop(s)
            span = self._spans.get(iteration, {}).get(peer)
            if span is not None:
                span.outstanding -= 1
                span.end = max(span.end, now)
        return len(done)

    def drop_peer(self, peer: str) -> None:
        """The link to ``peer`` is gone: its unfinished measurements mean nothing."""
        self._seqs.pop(peer, None)
        for spans in self._spans.values():
            spans.pop(peer, None)

    def ready(self, frontier: int, now: float) -> list[tuple[int, dict[str, float]]]:
        """Iterations at least ``settle`` behind ``frontier``, oldest first, with each peer's link time."""
        out: list[tuple[int, dict[str, float]]] = []
        for iteration in sorted(i for i in self._spans if i <= frontier - self.settle):
            spans = self._spans.pop(iteration)
            times = {
                p: (s.end if s.outstanding <= 0 else max(s.end, now)) - s.start for p, s in spans.items()
            }
            self._reported = max(self._reported, iteration)
            if times:
                out.append((iteration, times))
        return out
