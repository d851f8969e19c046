"""The ring's sparse reduce-scatter + all-gather for one round at one ring member.

Why a sparse ring. A star's root receives and sends N payloads per round; a ring spreads that load so every
link carries about 2(N-1)/N of a payload. Over COO payloads the classic ring still works if the block-index
space is cut into N contiguous segments (:func:`~gateways.rounds.aggregate.segment_bounds`): in N-1
reduce-scatter
steps member p passes segment (p - s) mod N on, adding its own slice each time, so after the last step it
holds the full sum of segment (p + 1) mod N; that owner finishes the segment (bounded per policy) and N-1
all-gather steps pass the finished segments around. Segments are disjoint ranges, so the result is their
concatenation and every member assembles the same bytes.

The ring waits for every member (no x-order inside it): STAR §IV-B moves stragglers out of the ring and
attaches them to a parent instead (parent–child), and a silent member is reported (``PeerSuspect``) so the
daemon can declare it lost, which re-runs the round without it.

These functions only update an :class:`~gateways.rounds.state.OpenRound` and return what to send; the engine
owns time, deadlines and closing.
"""

from __future__ import annotations

from collections.abc import Callable

from gateways.rounds.aggregate import aggregate, concat_segments, segment_bounds, split_segments
from gateways.rounds.state import OpenRound, merge_ids
from wanrt.errors import RemoteProtocolError
from wanrt.payload import SparsePayload, n_blocks
from wanrt.protocol.peer.round_msg import ContribId, RoundMsg

__all__ = ["Bound", "ring_result", "ring_start", "ring_steps", "take_segment_result", "take_segment_step"]

#: (sum of a segment, its size in blocks or None) -> (what to forward, what to keep as residual)
Bound = Callable[[SparsePayload | None, int | None], tuple[SparsePayload | None, SparsePayload | None]]


def ring_start(
    r: OpenRound,
    site: str,
    contrib: SparsePayload | None,
    ids: tuple[ContribId, ...],
    shape: tuple[int, int] | None,
) -> tuple[str, RoundMsg]:
    """Cut this member's contribution into segments and send its own segment on (step 0)."""
    plan = r.plan
    n, p = len(plan.core), plan.ring_position(site)
    if contrib is None and shape is not None:
        contrib = SparsePayload.empty(r.layer, *shape)
    if contrib is None:
        r.ring_slices = [None] * n
    else:
        bounds = segment_bounds(n_blocks(contrib.dense_len, contrib.block_size), n)
        r.ring_slices = list(split_segments(contrib, bounds))
    r.ring_ids = ids
    msg = RoundMsg("segment", r.iteration, r.layer, plan.plan_id, r.ring_slices[p], ids, 0, p)
    return plan.ring_next(site), msg


def take_segment_step(peer: str, r: OpenRound, m: RoundMsg, n: int, p: int) -> None:
    """Store a reduce-scatter step from the predecessor (it may arrive before this member started)."""
    if not 0 <= m.step <= n - 2 or m.segment != (p - 1 - m.step) % n:
        raise RemoteProtocolError("ring step and segment disagree", peer=peer, value=(m.step, m.segment))
    if m.step in r.ring_recv or m.step < r.ring_step:
        raise RemoteProtocolError("duplicate ring step", peer=peer, value=m.step)
    r.ring_recv[m.step] = m


def ring_steps(
    r: OpenRound,
    site: str,
    shape: tuple[int, int] | None,
    bound: Bound,
    narrow: Callable[[RoundMsg], RoundMsg] | None = None,
) -> list[tuple[str, RoundMsg]]:
    """Run every reduce-scatter step whose input has arrived; returns the messages to send on.

    ``narrow`` puts a finished segment in the wire dtype once, where it is made, so its owner keeps the
    very bytes the others receive (and the result's concatenation needs no conversion)."""
    plan = r.plan
    n = len(plan.core)
    slices = r.ring_slices
    if slices is None:
        return []
    nxt, prev = plan.ring_next(site), plan.ring_prev(site)
    sends: list[tuple[str, RoundMsg]] = []
    while r.ring_step <= n - 2 and r.ring_step in r.ring_recv:
        s = r.ring_step
        m = r.ring_recv.pop(s)
        g = m.segment
        acc = aggregate([m.payload, slices[g]], peers=[prev, None])
        ids = merge_ids(m.sites, r.ring_ids)
        if s < n - 2:
            sends.append((nxt, RoundMsg("segment", r.iteration, r.layer, plan.plan_id, acc, ids, s + 1, g)))
        else:  # this member owns segment g: finish it and start its all-gather
            scope = None
            if shape is not None:
                b = segment_bounds(n_blocks(*shape), n)
                scope = int(b[g + 1] - b[g])
            kept, rest = bound(acc, scope)
            if rest is not None:
                r.residuals[plan.plan_id] = rest
            fin = RoundMsg("segment_final", r.iteration, r.layer, plan.plan_id, kept, ids, 0, g)
            if narrow is not None:
                fin = narrow(fin)
            r.seg_finals[g] = fin
            sends.append((nxt, fin))
        r.ring_step += 1
    return sends


def take_segment_result(
    peer: str, r: OpenRound, m: RoundMsg, site: str, n: int
) -> list[tuple[str, RoundMsg]]:
    """Store a finished segment and pass it on unless the next member is the one that finished it."""
    if m.segment in r.seg_finals:
        raise RemoteProtocolError("duplicate segment result", peer=peer, value=m.segment)
    r.seg_finals[m.segment] = m
    nxt = r.plan.ring_next(site)
    owner = r.plan.core[(m.segment - 1) % n]  # member q finishes segment q + 1
    return [] if owner == nxt else [(nxt, m)]


def ring_result(r: OpenRound) -> RoundMsg | None:
    """The round's result once every finished segment is here, else ``None``."""
    n = len(r.plan.core)
    if len(r.seg_finals) < n:
        return None
    parts = [r.seg_finals[g].payload for g in range(n)]
    ids = merge_ids(*(r.seg_finals[g].sites for g in range(n)))
    known = next((q for q in parts if q is not None), None)
    payload = None
    if known is not None:
        empty = SparsePayload.empty(r.layer, known.dense_len, known.block_size)
        payload = concat_segments([q if q is not None else empty for q in parts])
    return RoundMsg("final", r.iteration, r.layer, r.plan.plan_id, payload, ids)
