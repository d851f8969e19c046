"""Per-iteration link times, measured per peer, for the rate allocator (seed 002's T_flow_i).

A round ends when its slowest link finishes, so the allocator wants, for each finished iteration, how long
each link took to carry that iteration's messages. Measured at the sender without any clock agreement:
each message's span runs from the moment its first chunk left for peer p to p's acknowledgement
(cumulative ``Ack`` s, sent once p's gateway has taken the messages), and a link's time in the iteration is
the *union* of its messages' spans — the time the link had that iteration's bytes in flight. Gaps in which
nothing was outstanding to p (the node waiting for the round's other inputs before it could send the next
layer) are not the link's time; counting them (first byte to last ack) dilutes a 3× slower link to ~1.3×.

An iteration is reported as soon as it can no longer change: no round of it (or older) is open at this
gateway and every message of it was acknowledged — not a fixed number of iterations later, so the
allocator reacts to the iteration that just ended. A fallback reports an iteration ``settle`` iterations
behind the frontier even if a peer still owes acknowledgements (counted with the time elapsed so far). A
peer whose link goes down is left out. Sans-IO: times are passed in.

Per peer, the reported iterations' times and bytes are also summed (``busy_s``, ``busy_bytes``): the
scheduler's link rate while sending is their ratio over a window (scheduler/control/link_rate.py), both
counted for the same iterations at the same moment, so a window never pairs one iteration's bytes with
another's time. ``peak_bps``: the last reported iteration's fastest message, bytes over its span — also
a lower bound on the link (the whole message crossed within its span), and a far better one when layers
trickle out during backward: their spans then overlap into one long busy time that reads the rate the
trainer produced bytes at, not the link's.

**Delivery while backlogged** (``backlog_bytes``, ``backlog_s``; :class:`DeliveryConfig`): the busy spans
hold a round trip each, so a 185 kB message on a 100 Mbit/s, 40 ms link reads 27 Mbit/s — too low to
size a payload by, and a step 100 → 30 Mbit/s moves it by less than the spans' jitter. A message's bytes
were on the link from its first chunk until its acknowledgement *minus one round trip* (the last byte
arrives half a round trip before the ack leaves, the first half a round trip after it was sent), so each
large message's interval is ``[start, ack − RTprop]``, with RTprop the link's windowed minimum span of
small messages (BBR's round-trip propagation estimate, Cardwell et al. 2016); per iteration the union of
those intervals and their bytes are summed, as for the busy time. Everything here is the gateway's own
send/ack path — the same for TCP over a WAN and for an emulated link. What it cannot remove: a token
bucket's burst (a policed link that idled lets its first bytes go at once) makes a message read fast by
about burst / size, and a peer whose CPU delays its acknowledgement makes it read slow; the scheduler's
windowed max per link and min over links (scheduler/control/link_rate.py) weigh the two.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from gateways.sending.config import DeliveryConfig

__all__ = ["MAX_OUTSTANDING", "LinkTimes", "union_length"]

#: Messages per peer awaiting acknowledgement before the oldest are forgotten (their measurement lost): a
#: peer that never acknowledges must not make the sender's bookkeeping grow without bound.
MAX_OUTSTANDING: Final = 1 << 16


@dataclass(slots=True)
class _Span:
    outstanding: int = 0
    nbytes: int = 0
    peak_bps: float = 0.0
    intervals: list[tuple[float, float]] = field(default_factory=list)
    #: the large messages' delivery intervals [start, ack − RTprop] and their bytes
    delivered: list[tuple[float, float]] = field(default_factory=list)
    delivered_bytes: int = 0


def union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by possibly overlapping intervals."""
    total = 0.0
    cur_start = cur_end = None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None and cur_start is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        elif end > cur_end:
            cur_end = end
    if cur_end is not None and cur_start is not None:
        total += cur_end - cur_start
    return total


class LinkTimes:
    """Collects spans per (iteration, peer) and hands out finished iterations in increasing order."""

    def __init__(self, settle: int, delivery: DeliveryConfig | None = None) -> None:
        self.settle = settle
        self.delivery = delivery if delivery is not None else DeliveryConfig()
        self._spans: dict[int, dict[str, _Span]] = {}
        self._seqs: dict[str, dict[int, tuple[int, float | None]]] = {}  # seq -> (iteration, start)
        self._reported = -1
        #: per peer, summed over the reported iterations: link time (s) and the bytes queued in them
        self.busy_s: dict[str, float] = {}
        self.busy_bytes: dict[str, int] = {}
        #: per peer, the last reported iteration's fastest message (bit/s)
        self.peak_bps: dict[str, float] = {}
        self._sizes: dict[str, dict[int, int]] = {}  # peer -> seq -> bytes, while outstanding
        #: per peer, summed over the reported iterations: bytes of the large messages and the union of
        #: their delivery intervals (module docstring); only peers with at least one sample
        self.backlog_s: dict[str, float] = {}
        self.backlog_bytes: dict[str, int] = {}
        self._rtprop: dict[str, tuple[float, float]] = {}  # peer -> (min span of small messages, when)

    def rtprop(self, peer: str) -> float | None:
        """The link's round-trip estimate: its smallest small-message span of the window (None: none)."""
        got = self._rtprop.get(peer)
        return None if got is None else got[0]

    def _observe_span(self, peer: str, nbytes: int, span_s: float, now: float) -> None:
        if nbytes > self.delivery.rtprop_max_bytes:
            return
        old = self._rtprop.get(peer)
        # BBR's RTprop: a new minimum, or any sample once the old minimum is older than the window (the
        # path may have lengthened; a stale minimum would make every later message read too fast)
        if old is None or span_s <= old[0] or now - old[1] > self.delivery.rtprop_window_s:
            self._rtprop[peer] = (span_s, now)

    def queued(self, peer: str, seq: int, iteration: int, nbytes: int = 0) -> None:
        """Message ``seq`` of ``iteration`` (``nbytes`` long) was queued for ``peer`` (it counts until
        acknowledged)."""
        seqs = self._seqs.setdefault(peer, {})
        if len(seqs) >= MAX_OUTSTANDING:
            old = next(iter(seqs))
            self._forget(peer, old, seqs.pop(old)[0])
            self._sizes.get(peer, {}).pop(old, None)
        if iteration <= self._reported:
            return  # a late reply for a reported iteration (e.g. a final re-sent to a rejoining peer)
        seqs[seq] = (iteration, None)
        if nbytes > 0:
            self._sizes.setdefault(peer, {})[seq] = nbytes
        span = self._spans.setdefault(iteration, {}).setdefault(peer, _Span())
        span.outstanding += 1
        span.nbytes += nbytes

    def _forget(self, peer: str, seq: int, iteration: int) -> None:
        span = self._spans.get(iteration, {}).get(peer)
        if span is not None:
            span.outstanding -= 1

    def started(self, peer: str, seq: int, now: float) -> None:
        """Message ``seq``'s first chunk left for ``peer``."""
        seqs = self._seqs.get(peer)
        if seqs is None or seq not in seqs:
            return
        iteration, start = seqs[seq]
        if start is None:
            seqs[seq] = (iteration, now)

    def acked_through(self, peer: str, seq: int, now: float) -> int:
        """``peer`` took every message up to ``seq`` (a cumulative ack); returns how many were outstanding."""
        seqs = self._seqs.get(peer)
        if not seqs:
            return 0
        done = [s for s in seqs if s <= seq]  # sending order is EDF order, not sequence order
        sizes = self._sizes.get(peer, {})
        for s in done:
            iteration, start = seqs.pop(s)
            nbytes = sizes.pop(s, 0)
            span = self._spans.get(iteration, {}).get(peer)
            if start is not None and nbytes > 0:
                self._observe_span(peer, nbytes, now - start, now)
            if span is not None:
                span.outstanding -= 1
                span.intervals.append((now if start is None else start, now))
                if start is not None and now > start and nbytes > 0:
                    span.peak_bps = max(span.peak_bps, 8.0 * nbytes / (now - start))
                    self._delivered(peer, span, start, nbytes, now)
        return len(done)

    def _delivered(self, peer: str, span: _Span, start: float, nbytes: int, now: float) -> None:
        cfg = self.delivery
        rtprop = self.rtprop(peer)
        if not cfg.enabled or rtprop is None or nbytes < cfg.min_bytes:
            return
        end = now - rtprop
        if end - start < cfg.min_net_s:
            return  # inside the round trip's jitter, or the whole message went out in the link's burst
        span.delivered.append((start, end))
        span.delivered_bytes += nbytes

    def drop_peer(self, peer: str) -> None:
        """The link to ``peer`` is gone: its unfinished measurements mean nothing."""
        self._seqs.pop(peer, None)
        self._sizes.pop(peer, None)
        self._rtprop.pop(peer, None)  # a new connection may take another path
        for spans in self._spans.values():
            spans.pop(peer, None)

    def ready(self, oldest_open: int | None, frontier: int, now: float) -> list[tuple[int, dict[str, float]]]:
        """Iterations that can no longer change, oldest first, with each peer's link time.

        ``oldest_open`` is the oldest iteration with a round still open at this gateway (None: none);
        an iteration at or after it is never reported, unless it is ``settle`` behind ``frontier``.
        """
        out: list[tuple[int, dict[str, float]]] = []
        for iteration in sorted(self._spans):
            spans = self._spans[iteration]
            forced = iteration <= frontier - self.settle
            finished = (oldest_open is None or iteration < oldest_open) and all(
                s.outstanding <= 0 for s in spans.values()
            )
            if not (forced or finished):
                break  # in order: a later iteration waits for this one
            del self._spans[iteration]
            times = {}
            for p, s in spans.items():
                intervals = list(s.intervals)
                if s.outstanding > 0:
                    starts = [st for (it, st) in self._seqs.get(p, {}).values() if it == iteration]
                    intervals += [(now if st is None else st, now) for st in starts]
                times[p] = union_length(intervals)
                self.busy_s[p] = self.busy_s.get(p, 0.0) + times[p]
                self.busy_bytes[p] = self.busy_bytes.get(p, 0) + s.nbytes
                if s.peak_bps > 0:
                    self.peak_bps[p] = s.peak_bps
                if s.delivered:
                    self.backlog_s[p] = self.backlog_s.get(p, 0.0) + union_length(s.delivered)
                    self.backlog_bytes[p] = self.backlog_bytes.get(p, 0) + s.delivered_bytes
            self._reported = max(self._reported, iteration)
            if times:
                out.append((iteration, times))
        return out
