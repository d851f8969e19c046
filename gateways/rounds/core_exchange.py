"""A round's reduce-scatter + all-gather among the core members (ring and all-pairs plans), at one member.

Why its own place. Under ring, all-pairs and parent–child plans the core finishes a round together: the
block-index space is cut into one segment per member, the slices are summed by their owners and the
finished segments are gathered by everyone (:mod:`gateways.rounds.ring`, :mod:`gateways.rounds.allpairs`
hold the per-message steps). What the engine needs from that exchange is small — start it with this
member's contribution, take a peer's segment in, move on as far as the inputs allow, and say when the
round's result is assembled — and so is what the exchange needs from the engine: the layer's shape, the
forwarding bound and the wire narrowing. This class is that interface. It also holds the streamed-push
path (a push still arriving in pieces, :class:`~wanrt.protocol.PushPiece`): the slices its pieces complete
leave early, cut exactly as the whole push would be, so the owners see the same bytes either way.

It returns what to send; the engine sends it, owns the round's deadlines and closes it. Sans-IO.
"""

from __future__ import annotations

import bisect

import numpy as np

from gateways.rounds.allpairs import (
    allpairs_presend,
    allpairs_reduce,
    allpairs_result,
    allpairs_start,
    allpairs_waiting_on,
    piece_count,
    take_part,
    take_segment_final,
)
from gateways.rounds.checks import check_allpairs_message, check_ring_message
from gateways.rounds.config import RoundConfig
from gateways.rounds.forward_bound import ForwardBound
from gateways.rounds.layer_formats import LayerFormats
from gateways.rounds.ring import ring_result, ring_start, ring_steps, take_segment_result, take_segment_step
from gateways.rounds.state import EngineStats, OpenRound
from wanrt.errors import RemoteProtocolError
from wanrt.payload import SparsePayload
from wanrt.protocol.peer.round_msg import ContribId, RoundMsg

__all__ = ["CoreExchange", "Sends"]

#: messages to send, in order: ``(peer, message)``
Sends = list[tuple[str, RoundMsg]]

#: the name under which the local trainers' faults are reported (as gateways.rounds.engine.TRAINER)
_TRAINER = "trainer"


def _same_payload(a: SparsePayload, b: SparsePayload) -> bool:
    """The same blocks with the same value bits (a resent piece of a streamed push)."""
    return (
        a.value_dtype == b.value_dtype
        and np.array_equal(a.indices, b.indices)
        and np.array_equal(a.values.view(np.uint8), b.values.view(np.uint8))
    )


class CoreExchange:
    """The core's segment exchange of gateway ``site``: ring steps, or all-pairs parts and pieces."""

    def __init__(
        self, site: str, config: RoundConfig, formats: LayerFormats, forward: ForwardBound, stats: EngineStats
    ) -> None:
        self.site = site
        self.config = config
        self._formats = formats
        self._bound = forward.bound
        self._stats = stats

    def pieces(self, r: OpenRound) -> int:
        """Pieces per all-pairs segment of ``r`` (cut-through, ``allpairs_chunk_bytes``); one under the
        ``cap`` policy, which bounds whole segments."""
        chunk = self.config.allpairs_chunk_bytes if self.config.forward_policy != "cap" else 0
        return piece_count(self._formats.shape(r.layer), len(r.plan.core), chunk)

    @staticmethod
    def presending(r: OpenRound) -> bool:
        """Slices of this site's streamed push left under the round's current plan."""
        return bool(r.pre_sent) and r.pre_plan == r.plan.plan_id

    # -- streamed pushes ---------------------------------------------------------------------------------
    def may_stream(self, r: OpenRound, quorum: bool) -> bool:
        """Whether a streamed push's pieces may leave before it is whole: only where the whole push would
        become this member's contribution unchanged — an all-pairs core member with no children, under
        ``forward_policy = "exact"``, in a plan with a quorum (``quorum``)."""
        plan = r.plan
        return (
            plan.all_pairs
            and len(plan.core) >= 2
            and plan.in_core(self.site)
            and not plan.children_of(self.site)
            and quorum
            and self.config.forward_policy == "exact"
        )

    def stream_parts(self, r: OpenRound, lo: int, hi: int, payload: SparsePayload) -> bool:
        """Keep piece ``[lo, hi)`` of a streamed push; False if it repeats one here (same bytes)."""
        parts = r.pre_parts
        i = bisect.bisect_left(parts, lo, key=lambda x: x[0])
        for a, b, p in parts[max(0, i - 1) : i + 1]:
            if a < hi and lo < b:
                if (a, b) != (lo, hi) or not _same_payload(p, payload):
                    raise RemoteProtocolError(
                        "a resent streamed push differs from the pieces already forwarded",
                        peer=_TRAINER,
                        value=(lo, hi),
                    )
                return False
        parts.insert(i, (lo, hi, payload))
        return True

    def presend(self, r: OpenRound, now: float) -> Sends:
        """The slices the pieces kept so far complete, not sent yet; once any left, the round waits on the
        ring (its own deadline no longer applies: the others already hold part of the push)."""
        if r.pre_plan != r.plan.plan_id:
            r.pre_plan, r.pre_sent = r.plan.plan_id, set()
        shape = self._formats.shapes[r.layer]
        ids = r.ring_ids = ((self.site, r.iteration),)  # as allpairs_start will say (nothing folded)
        sends = allpairs_presend(r, self.site, shape, self.pieces(r), ids)
        self._stats.streamed_slices += len(sends)
        if r.pre_sent:
            r.wait_since, r.wait_reason = now, "ring"
        return sends

    # -- the exchange ------------------------------------------------------------------------------------
    def start(
        self, r: OpenRound, contrib: SparsePayload | None, ids: tuple[ContribId, ...], now: float
    ) -> Sends:
        """This member's contribution (with its ids) enters the exchange."""
        shape = self._formats.shape(r.layer)
        if r.plan.all_pairs:
            direct = self.config.allpairs_direct
            k = self.pieces(r)
            sent = r.pre_sent if self.presending(r) else frozenset()
            sends = allpairs_start(r, self.site, contrib, ids, shape, direct=direct, pieces=k, sent=sent)
            r.wait_since, r.wait_reason = now, "ring"
            return list(sends)
        to, msg = ring_start(r, self.site, contrib, ids, shape)
        r.wait_peer, r.wait_since, r.wait_reason = r.plan.ring_prev(self.site), now, "ring"
        return [(to, msg)]

    def take_segment(self, peer: str, r: OpenRound, m: RoundMsg) -> None:
        """A ``segment`` from ``peer``: a ring step's partial sum or an all-pairs part (checked first)."""
        shape = self._formats.shape(m.layer)
        if r.plan.all_pairs:
            k = self.pieces(r)
            check_allpairs_message(peer, r.plan, self.site, m, shape, k)
            take_part(peer, r, m, k)
        else:
            n, p = check_ring_message(peer, r.plan, self.site, m, shape)
            take_segment_step(peer, r, m, n, p)

    def take_segment_final(self, peer: str, r: OpenRound, m: RoundMsg, now: float) -> Sends:
        """A finished segment from ``peer``; on a ring it is passed on to the next member."""
        shape = self._formats.shape(m.layer)
        if r.plan.all_pairs:
            k = self.pieces(r)
            check_allpairs_message(peer, r.plan, self.site, m, shape, k)
            take_segment_final(peer, r, m, k)
            return []
        n, _ = check_ring_message(peer, r.plan, self.site, m, shape)
        sends = take_segment_result(peer, r, m, self.site, n)
        r.wait_since = now
        return list(sends)

    def progress(self, r: OpenRound, now: float) -> tuple[Sends, RoundMsg | None]:
        """Every step the inputs here allow: what to send, and the round's result once assembled (not yet
        narrowed to the wire dtype: the engine does that where it closes the round)."""
        shape = self._formats.shape(r.layer)
        narrow = self._formats.narrow
        if r.plan.all_pairs:
            k = self.pieces(r)
            early = r.ring_slices is None  # a streamed push not whole yet (see RoundEngine.local_piece)
            sends = list(allpairs_reduce(r, self.site, shape, self._bound, narrow, k, early))
            # wait on the first member still missing; a new wait (progress) restarts the suspect clock.
            # Not while this site's own streamed push is incomplete: the others may be waiting for it
            waiting = None if early else allpairs_waiting_on(r, self.site, k)
            if waiting != r.wait_peer:
                r.wait_peer, r.wait_since, r.suspected = waiting, now, False
        else:
            sends = list(ring_steps(r, self.site, shape, self._bound, narrow))
            if sends:
                r.wait_since = now
        if r.ring_slices is None:
            return sends, None  # the round closes only once this site's streamed push is whole and taken
        final = allpairs_result(r, self.pieces(r)) if r.plan.all_pairs else ring_result(r)
        return sends, final
