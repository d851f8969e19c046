"""The all-pairs ("butterfly") sparse reduce-scatter + all-gather for one round at one core member.

Why all pairs. The ring moves 2(N-1)/N of a payload per site, but one link at a time: in each of its
2(N-1) steps a member talks only to its successor while its other N-2 links idle, and every step adds a
message latency, a decode, a sum and an encode. When every pair of sites has its own WAN path (a full mesh),
the same bytes can leave on all N-1 links at once:

* **reduce-scatter** — the block-index space is cut into the ring's N contiguous segments
  (:func:`~gateways.rounds.aggregate.segment_bounds`); core member ``g`` owns segment ``g``. Each member
  sends its slice of segment ``g`` straight to member ``g``, for every ``g`` but its own: N-1 messages, one
  per link, in parallel.
* **reduce** — the owner sums the N slices of its segment (its own and one from every other member) in core
  position order, so every run sums in the same order and is bit-reproducible, then bounds the sum per
  ``forward_policy`` (the remainder stays in its residual, as in the ring).
* **all-gather** — the owner sends its finished segment (``segment_final``) straight to every other member:
  N-1 more messages, in parallel. A member holding all N finished segments concatenates them into the
  round's result (:func:`~gateways.rounds.ring.ring_result`), so every member assembles the same bytes.

Each member sends 2(N-1) messages per round, two to every peer; a round costs two message latencies
instead of the ring's 2(N-1). The owner waits for every member's slice like the ring waits for its
predecessor (no x-order inside the core: STAR §IV-B moves stragglers out of it and attaches them to a
parent, as under parent–child); a silent member is reported (``PeerSuspect``) so the daemon can declare it
lost, which re-runs the round without it.

State lives in the :class:`~gateways.rounds.state.OpenRound` fields the ring uses: ``ring_slices`` (this
member's cut contribution), ``ring_ids``, ``ring_recv`` (slices of the owned segment received, keyed by
the sender's core position), ``ring_step`` (1 once the owned segment is reduced) and ``seg_finals``. These
functions only update it and return what to send; the engine owns time, deadlines and closing.
"""

from __future__ import annotations

from collections.abc import Callable

from gateways.rounds.aggregate import aggregate, segment_bounds, split_segments
from gateways.rounds.messages import ContribId, RoundMsg
from gateways.rounds.ring import Bound
from gateways.rounds.state import OpenRound, merge_ids
from wanrt.errors import RemoteProtocolError
from wanrt.payload import SparsePayload, n_blocks

__all__ = [
    "allpairs_reduce",
    "allpairs_start",
    "allpairs_waiting_on",
    "take_part",
    "take_segment_final",
]


def allpairs_start(
    r: OpenRound,
    site: str,
    contrib: SparsePayload | None,
    ids: tuple[ContribId, ...],
    shape: tuple[int, int] | None,
) -> list[tuple[str, RoundMsg]]:
    """Cut this member's contribution into segments and send each to its owner (all at once)."""
    plan = r.plan
    n, p = len(plan.core), plan.ring_position(site)
    if contrib is None and shape is not None:
        contrib = SparsePayload.empty(r.layer, *shape)
    if contrib is None:
        r.ring_slices = [None] * n
    else:
        bounds = segment_bounds(n_blocks(contrib.dense_len, contrib.block_size), n)
        r.ring_slices = list(split_segments(contrib, bounds, keep_dtype=True))
    r.ring_ids = ids
    return [
        (owner, RoundMsg("segment", r.iteration, r.layer, plan.plan_id, r.ring_slices[g], ids, 0, g))
        for g, owner in enumerate(plan.core)
        if g != p
    ]


def take_part(peer: str, r: OpenRound, m: RoundMsg) -> None:
    """Store a member's slice of the segment this member owns (it may arrive before this member started)."""
    q = r.plan.ring_position(peer)
    if q in r.ring_recv or r.ring_step:
        raise RemoteProtocolError("duplicate all-pairs part", peer=peer, value=m.segment)
    r.ring_recv[q] = m


def take_segment_final(peer: str, r: OpenRound, m: RoundMsg) -> None:
    """Store a finished segment from its owner."""
    if m.segment in r.seg_finals:
        raise RemoteProtocolError("duplicate segment result", peer=peer, value=m.segment)
    r.seg_finals[m.segment] = m


def allpairs_reduce(
    r: OpenRound,
    site: str,
    shape: tuple[int, int] | None,
    bound: Bound,
    narrow: Callable[[RoundMsg], RoundMsg],
) -> list[tuple[str, RoundMsg]]:
    """Once every slice of the owned segment is here: sum them in core order, bound the sum, and send the
    finished segment to every other member (narrowed once, here, so the owner keeps the very bytes the
    others get). Returns the messages to send (none before that)."""
    plan = r.plan
    n, p = len(plan.core), plan.ring_position(site)
    slices = r.ring_slices
    if slices is None or r.ring_step or len(r.ring_recv) < n - 1:
        return []
    recv = r.ring_recv
    parts = [slices[p] if q == p else recv[q].payload for q in range(n)]
    acc = aggregate(parts, peers=[None if q == p else plan.core[q] for q in range(n)])
    ids = merge_ids(r.ring_ids, *(recv[q].sites for q in range(n) if q != p))
    scope = None
    if shape is not None:
        b = segment_bounds(n_blocks(*shape), n)
        scope = int(b[p + 1] - b[p])
    kept, rest = bound(acc, scope)
    if rest is not None:
        r.residuals[plan.plan_id] = rest
    fin = narrow(RoundMsg("segment_final", r.iteration, r.layer, plan.plan_id, kept, ids, 0, p))
    r.seg_finals[p] = fin
    recv.clear()  # the slices are summed: drop them now (a dense round holds N of them)
    r.ring_step = 1
    return [(q, fin) for q in plan.core if q != site]


def allpairs_waiting_on(r: OpenRound, site: str) -> str | None:
    """The first member this one still waits for: a missing slice before the reduce, then a missing
    finished segment (``None``: nothing is missing)."""
    plan = r.plan
    p = plan.ring_position(site)
    if not r.ring_step:
        for q, s in enumerate(plan.core):
            if q != p and q not in r.ring_recv:
                return s
    for g, s in enumerate(plan.core):
        if g != p and g not in r.seg_finals:
            return s
    return None
