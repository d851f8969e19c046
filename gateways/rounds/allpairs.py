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
instead of the ring's 2(N-1).

**Direct rounds (one hop) for sparse contributions.** A member whose contribution is sparse sends it
*whole* to every other member instead of cutting it (``segment`` = -1). Per link that costs the whole
contribution |C| instead of a slice |C|/N plus a finished segment |U|/N (U = the union of the sites'
blocks); at the ~1 % densities wanrt runs at the sites' blocks barely overlap, |U| ≈ N·|C|, so the bytes are
about the same — and the all-gather, a whole message latency plus an encode and a decode at every member, is
saved: when *every* member sent its contribution whole, each member has all N of them and computes every
segment itself, exactly as its owner would (the same inputs summed in the same core order, bounded per
segment, narrowed per segment), so every site still ends with the same bytes, and each member keeps only
the residual of its own segment, as the owner would. Whether all members went direct is known to every
member once it has everybody's message, so all take the same path; if any member cut its contribution,
the round runs the two-hop exchange (an owner takes its slice out of a whole contribution). A member goes
direct when N·(N-1)·nnz ≤ n_blocks (:func:`sends_whole`): the densities up to which the bytes stay about
the same even when the sites' blocks overlap (for blocks drawn independently the break-even is ~2/N²);
``direct = False`` turns it off. The owner waits for every member's slice like the ring waits for its
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

import numpy as np

from gateways.rounds.aggregate import aggregate, segment_bounds, split_segments
from gateways.rounds.messages import ContribId, RoundMsg
from gateways.rounds.ring import Bound
from gateways.rounds.state import OpenRound, merge_ids
from wanrt.errors import RemoteProtocolError
from wanrt.payload import SparsePayload, n_blocks

__all__ = [
    "WHOLE",
    "allpairs_reduce",
    "allpairs_start",
    "allpairs_waiting_on",
    "sends_whole",
    "take_part",
    "take_segment_final",
]

#: ``segment`` of a part that carries a member's whole contribution (a direct round).
WHOLE = -1


def sends_whole(contrib: SparsePayload | None, n: int) -> bool:
    """A contribution sparse enough to go to every member whole (see the module docstring)."""
    if contrib is None:
        return True
    return n * (n - 1) * contrib.nnz_blocks <= n_blocks(contrib.dense_len, contrib.block_size)


def allpairs_start(
    r: OpenRound,
    site: str,
    contrib: SparsePayload | None,
    ids: tuple[ContribId, ...],
    shape: tuple[int, int] | None,
    *,
    direct: bool = True,
) -> list[tuple[str, RoundMsg]]:
    """Send this member's contribution on, all at once: each segment to its owner, or (``direct`` and
    sparse) the whole contribution to every other member."""
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
    r.whole = direct and sends_whole(contrib, n)
    if r.whole:
        whole = RoundMsg("segment", r.iteration, r.layer, plan.plan_id, contrib, ids, 0, WHOLE)
        return [(owner, whole) for owner in plan.core if owner != site]
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


def _slice(m: RoundMsg, g: int, n: int) -> SparsePayload | None:
    """Segment ``g`` of a received part: the part itself, or cut out of a whole contribution."""
    p = m.payload
    if m.segment != WHOLE or p is None:
        return p
    bounds = segment_bounds(n_blocks(p.dense_len, p.block_size), n)
    a, b = (int(x) for x in np.searchsorted(p.indices, bounds[g : g + 2]))
    bs = p.block_size
    return SparsePayload(p.layer, p.dense_len, bs, p.indices[a:b], p.values[a * bs : b * bs], p.value_dtype)


def _finish(
    r: OpenRound,
    g: int,
    acc: SparsePayload | None,
    ids: tuple[ContribId, ...],
    shape: tuple[int, int] | None,
    bound: Bound,
    narrow: Callable[[RoundMsg], RoundMsg],
    keep_residual: bool,
) -> RoundMsg:
    """Segment ``g``'s result from its sum: bounded, narrowed once."""
    n = len(r.plan.core)
    scope = None
    if shape is not None:
        b = segment_bounds(n_blocks(*shape), n)
        scope = int(b[g + 1] - b[g])
    kept, rest = bound(acc, scope)
    if rest is not None and keep_residual:
        r.residuals[r.plan.plan_id] = rest
    fin = narrow(RoundMsg("segment_final", r.iteration, r.layer, r.plan.plan_id, kept, ids, 0, g))
    r.seg_finals[g] = fin
    return fin


def _absorb(r: OpenRound, p: int, n: int) -> None:
    """Add every slice of the owned segment that is here to the running sum, in core order: the sum is
    built while later slices are still on the wire, so the last arrival costs one addition, not N - 1.
    ``aggregate`` of a prefix and the next slice adds each block in the order a single ``aggregate`` of
    all N would (the first addend lands unchanged, the others in input order), so the bits are the same."""
    while r.ap_next < n:
        q = r.ap_next
        if q == p:
            if r.ring_slices is None:
                return
            part = r.ring_slices[p]
        else:
            m = r.ring_recv.get(q)
            if m is None:
                return
            part = _slice(m, p, n)
        peer = None if q == p else r.plan.core[q]
        r.ap_sum = (
            aggregate([part], peers=[peer]) if q == 0 else aggregate([r.ap_sum, part], peers=[None, peer])
        )
        r.ap_next += 1


def allpairs_reduce(
    r: OpenRound,
    site: str,
    shape: tuple[int, int] | None,
    bound: Bound,
    narrow: Callable[[RoundMsg], RoundMsg],
) -> list[tuple[str, RoundMsg]]:
    """Once every member's part is here: if all came whole, compute every segment here (a direct round,
    nothing more to send); else finish the sum of the owned segment (built in core order as the slices
    came, :func:`_absorb`), bound it, and send the finished segment to every other member (narrowed once,
    here, so the owner keeps the very bytes the others get). Returns the messages to send."""
    plan = r.plan
    n, p = len(plan.core), plan.ring_position(site)
    slices = r.ring_slices
    if r.ring_step:
        return []
    _absorb(r, p, n)
    if slices is None or len(r.ring_recv) < n - 1:
        return []
    recv = r.ring_recv
    ids = merge_ids(r.ring_ids, *(recv[q].sites for q in range(n) if q != p))
    r.ring_step = 1
    own, r.ap_sum = r.ap_sum, None
    if r.whole and all(m.segment == WHOLE for m in recv.values()):
        for g in range(n):
            if g == p:
                acc = own
            else:
                parts = [slices[g] if q == p else _slice(recv[q], g, n) for q in range(n)]
                acc = aggregate(parts, peers=[plan.core[q] for q in range(n)])
            _finish(r, g, acc, ids, shape, bound, narrow, keep_residual=g == p)
        recv.clear()
        return []
    fin = _finish(r, p, own, ids, shape, bound, narrow, keep_residual=True)
    recv.clear()  # the slices are summed: drop them now (a dense round holds N of them)
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
