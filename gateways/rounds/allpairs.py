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

import functools
from collections.abc import Callable
from collections.abc import Set as AbstractSet

import numpy as np
import numpy.typing as npt

from gateways.rounds.aggregate import aggregate, concat_segments, segment_bounds, split_segments
from gateways.rounds.ring import Bound, ring_result
from gateways.rounds.state import OpenRound, merge_ids
from wanrt.errors import RemoteProtocolError
from wanrt.payload import SparsePayload, n_blocks
from wanrt.protocol.peer.round_msg import ContribId, RoundMsg

__all__ = [
    "WHOLE",
    "allpairs_presend",
    "allpairs_reduce",
    "allpairs_result",
    "allpairs_start",
    "allpairs_waiting_on",
    "cut_blocks",
    "piece_bounds",
    "piece_count",
    "sends_whole",
    "take_part",
    "take_segment_final",
]

#: ``segment`` of a part that carries a member's whole contribution (a direct round).
WHOLE = -1

#: Bytes of one dense fp32 value: pieces are sized on the dense fp32 layer, so every site cuts the same
#: pieces whatever dtype its values travel in.
_F32 = 4


def piece_count(shape: tuple[int, int] | None, n: int, chunk_bytes: int) -> int:
    """Pieces per segment: enough that one piece of dense fp32 values is at most ``chunk_bytes`` (1 if
    off, the shape is unknown or a segment is a single block). A function of the layer shape and the
    config only, so every member computes the same cut."""
    if shape is None or chunk_bytes <= 0 or n < 1:
        return 1
    dense_len, block_size = shape
    seg = n_blocks(dense_len, block_size) // n
    if seg <= 1:
        return 1
    return max(1, min(seg, -(-seg * block_size * _F32 // chunk_bytes)))


@functools.lru_cache(maxsize=1024)
def piece_bounds(total_blocks: int, n: int, pieces: int) -> npt.NDArray[np.int64]:
    """``n * pieces + 1`` boundaries: segment ``g`` of :func:`segment_bounds` cut into ``pieces`` near-equal
    pieces; piece ``k`` of segment ``g`` is ``[b[g*pieces + k], b[g*pieces + k + 1])``. Segment boundaries
    are kept, so one piece per segment is exactly the unchunked cut. Cached and read-only (every message
    of a round is checked against it)."""
    seg = segment_bounds(total_blocks, n)
    k = np.arange(pieces, dtype=np.int64)
    lo, width = seg[:-1, None], (seg[1:] - seg[:-1])[:, None]
    out = np.append((lo + (width * k[None, :]) // pieces).reshape(-1), np.int64(total_blocks))
    out.flags.writeable = False
    return out


def cut_blocks(p: SparsePayload, lo: int, hi: int) -> SparsePayload:
    """The blocks of ``p`` in ``[lo, hi)``, as views of ``p``'s arrays (no copy, no conversion)."""
    a, b = (int(x) for x in np.searchsorted(p.indices, (lo, hi)))
    bs = p.block_size
    return SparsePayload(p.layer, p.dense_len, bs, p.indices[a:b], p.values[a * bs : b * bs], p.value_dtype)


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
    pieces: int = 1,
    sent: AbstractSet[tuple[int, int]] = frozenset(),
) -> list[tuple[str, RoundMsg]]:
    """Send this member's contribution on, all at once: each segment to its owner in ``pieces`` pieces
    (piece-major: piece k goes out on every link before piece k+1, so every owner can start summing early),
    or (``direct`` and sparse) the whole contribution to every other member. ``sent``: the (piece, segment)
    slices already forwarded from a streamed push (:func:`allpairs_presend`); the round is then two-hop."""
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
    r.whole = direct and not sent and sends_whole(contrib, n)
    if r.whole:
        whole = RoundMsg("segment", r.iteration, r.layer, plan.plan_id, contrib, ids, 0, WHOLE)
        return [(owner, whole) for owner in plan.core if owner != site]
    slices = r.ring_slices
    if contrib is None or pieces == 1:
        return [
            (owner, RoundMsg("segment", r.iteration, r.layer, plan.plan_id, slices[g], ids, 0, g))
            for g, owner in enumerate(plan.core)
            if g != p and (0, g) not in sent
        ]
    b = piece_bounds(n_blocks(contrib.dense_len, contrib.block_size), n, pieces)
    out: list[tuple[str, RoundMsg]] = []
    for k in range(pieces):
        for g, owner in enumerate(plan.core):
            part = slices[g]
            if g == p or part is None or (k, g) in sent:
                continue
            lo, hi = int(b[g * pieces + k]), int(b[g * pieces + k + 1])
            piece = cut_blocks(part, lo, hi)
            out.append((owner, RoundMsg("segment", r.iteration, r.layer, plan.plan_id, piece, ids, k, g)))
    return out


def _covered(parts: list[tuple[int, int, SparsePayload]], lo: int, hi: int) -> SparsePayload | None:
    """Blocks ``[lo, hi)`` out of the streamed pieces ``parts`` (disjoint, sorted by ``lo``) if they cover
    the range: a view when one piece does (the trainer cut its push as this gateway forwards it), else
    the cut pieces joined."""
    got: list[SparsePayload] = []
    at = lo
    for a, b, p in parts:
        if b <= at:
            continue
        if a > at:
            return None
        got.append(cut_blocks(p, at, min(b, hi)) if (a, b) != (at, hi) else p)
        at = b
        if at >= hi:
            return got[0] if len(got) == 1 else concat_segments(got)
    return None


def allpairs_presend(
    r: OpenRound, site: str, shape: tuple[int, int], pieces: int, ids: tuple[ContribId, ...]
) -> list[tuple[str, RoundMsg]]:
    """Streamed push: the (piece, segment) slices of this member's contribution that the pieces received so
    far (``r.pre_parts``) cover and that were not forwarded yet, to their owners, piece-major. Cut exactly
    as :func:`allpairs_start` cuts the whole push, so the owners see the same bytes either way."""
    plan = r.plan
    n, p = len(plan.core), plan.ring_position(site)
    b = piece_bounds(n_blocks(*shape), n, pieces)
    out: list[tuple[str, RoundMsg]] = []
    for k in range(pieces):
        for g, owner in enumerate(plan.core):
            if g == p or (k, g) in r.pre_sent:
                continue
            piece = _covered(r.pre_parts, int(b[g * pieces + k]), int(b[g * pieces + k + 1]))
            if piece is None:
                continue
            r.pre_sent.add((k, g))
            msg = RoundMsg("segment", r.iteration, r.layer, plan.plan_id, piece, ids, k, g)
            out.append((owner, msg))
    return out


def _covers(m: RoundMsg, pieces: int) -> range:
    """The pieces one received message fills: all of them for a whole contribution or an empty message
    (a sender that knew no shape cuts nothing), else its own (``step``)."""
    if m.segment == WHOLE or m.payload is None:
        return range(pieces)
    return range(m.step, m.step + 1)


def _stored(d: dict[tuple[int, int], RoundMsg], who: int, k: int) -> RoundMsg | None:
    """The message standing for piece ``k`` from (or of) ``who``: the piece itself, or one stored under
    piece 0 that stands for every piece (whole, or empty) — stored when the layer's shape was still unknown
    here, so the cut was one piece then; it must not block the pieces of the cut learned since."""
    m = d.get((who, k))
    if m is None and k:
        m0 = d.get((who, 0))
        if m0 is not None and (m0.segment == WHOLE or m0.payload is None):
            return m0
    return m


def take_part(peer: str, r: OpenRound, m: RoundMsg, pieces: int = 1) -> None:
    """Store a member's part for the segment this member owns (it may arrive before this member started):
    one piece, or a whole contribution / empty part standing for every piece."""
    q = r.plan.ring_position(peer)
    covers = _covers(m, pieces)
    if r.ring_step or any((q, k) in r.ap_recv for k in covers):
        raise RemoteProtocolError("duplicate all-pairs part", peer=peer, value=(m.segment, m.step))
    for k in covers:
        r.ap_recv[(q, k)] = m


def take_segment_final(peer: str, r: OpenRound, m: RoundMsg, pieces: int = 1) -> None:
    """Store a finished piece (or, from an owner that knew no shape, an empty finished segment)."""
    covers = _covers(m, pieces)
    if any((m.segment, k) in r.ap_finals for k in covers):
        raise RemoteProtocolError("duplicate segment result", peer=peer, value=(m.segment, m.step))
    for k in covers:
        r.ap_finals[(m.segment, k)] = m
    stage_final(r, m, pieces)


def stage_final(r: OpenRound, m: RoundMsg, pieces: int) -> None:
    """Copy a dense finished piece into the round's result buffer now, while later pieces are still on
    the wire: the result is then ready when the last piece lands (one piece copied, not the whole layer
    concatenated after it). Only while every finished piece so far is dense over its range in one dtype
    (a dense layer); anything else (sparse, an empty stand-in, mixed dtypes) leaves the concatenation to
    :func:`allpairs_result`, which gives the same bytes."""
    p = m.payload
    if r.ap_staged < 0 or p is None or m.segment < 0:
        r.ap_staged = -1
        r.ap_buf = None
        r.ap_fresh.clear()
        return
    n = len(r.plan.core)
    b = piece_bounds(n_blocks(p.dense_len, p.block_size), n, pieces)
    lo, hi = int(b[m.segment * pieces + m.step]), int(b[m.segment * pieces + m.step + 1])
    bs = p.block_size
    if p.nnz_blocks != hi - lo or (r.ap_buf is not None and r.ap_buf.dtype != p.values.dtype):
        r.ap_staged = -1
        r.ap_buf = None
        r.ap_fresh.clear()
        return
    if r.ap_buf is None:
        r.ap_buf = np.empty(n_blocks(p.dense_len, bs) * bs, dtype=p.values.dtype)
    r.ap_buf[lo * bs : hi * bs] = p.values
    r.ap_staged += 1
    r.ap_fresh.append((lo, hi, p))  # the engine may stream it to the trainer now (DeliverPiece)


def _slice(m: RoundMsg, g: int, n: int) -> SparsePayload | None:
    """Segment ``g`` of a received part: the part itself, or cut out of a whole contribution."""
    p = m.payload
    if m.segment != WHOLE or p is None:
        return p
    bounds = segment_bounds(n_blocks(p.dense_len, p.block_size), n)
    return cut_blocks(p, int(bounds[g]), int(bounds[g + 1]))


def _piece(
    part: SparsePayload | None, whole: bool, g: int, k: int, n: int, pieces: int
) -> SparsePayload | None:
    """Piece ``k`` of segment ``g`` out of a part: a piece as received, or cut from a segment slice or a
    whole contribution (views)."""
    if part is None or (pieces == 1 and not whole):
        return part
    b = piece_bounds(n_blocks(part.dense_len, part.block_size), n, pieces)
    return cut_blocks(part, int(b[g * pieces + k]), int(b[g * pieces + k + 1]))


def _finish(
    r: OpenRound,
    g: int,
    acc: SparsePayload | None,
    ids: tuple[ContribId, ...],
    shape: tuple[int, int] | None,
    bound: Bound,
    narrow: Callable[[RoundMsg], RoundMsg],
    keep_residual: bool,
    k: int = 0,
) -> RoundMsg:
    """Segment ``g``'s (piece ``k``'s) result from its sum: bounded, narrowed once. The bound is per
    segment: with ``forward_policy = "cap"`` a segment is one piece (the engine asks for one)."""
    n = len(r.plan.core)
    scope = None
    if shape is not None:
        b = segment_bounds(n_blocks(*shape), n)
        scope = int(b[g + 1] - b[g])
    kept, rest = bound(acc, scope)
    if rest is not None and keep_residual:
        r.residuals[r.plan.plan_id] = rest
    return narrow(RoundMsg("segment_final", r.iteration, r.layer, r.plan.plan_id, kept, ids, k, g))


def _absorb(r: OpenRound, p: int, n: int, k: int, pieces: int, bounds: tuple[int, int] | None) -> bool:
    """Add every slice of piece ``k`` of the owned segment that is here to its running sum, in core order:
    the sum is built while later slices are still on the wire, so the last arrival costs one addition, not
    N - 1. ``aggregate`` of a prefix and the next slice adds each block in the order a single ``aggregate``
    of all N would (the first addend lands unchanged, the others in input order), so the bits are the same
    (and the same for any number of pieces: sums are per block). True once all N are summed."""
    nxt, acc = r.ap_sums.get(k, (0, None))
    slices = r.ring_slices
    while nxt < n:
        if nxt == p:
            if slices is not None:
                part = _piece(slices[p], False, p, k, n, pieces)
            else:  # a streamed push, not whole yet: its piece of the owned segment, if here
                early = None if bounds is None else _covered(r.pre_parts, bounds[0], bounds[1])
                if early is None:
                    break
                part = early
        else:
            m = _stored(r.ap_recv, nxt, k)
            if m is None:
                break
            whole = m.segment == WHOLE
            part = _piece(m.payload, True, p, k, n, pieces) if whole else m.payload
        peer = None if nxt == p else r.plan.core[nxt]
        acc = aggregate([part], peers=[peer]) if nxt == 0 else aggregate([acc, part], peers=[None, peer])
        nxt += 1
    r.ap_sums[k] = (nxt, acc)
    return nxt == n


def allpairs_reduce(
    r: OpenRound,
    site: str,
    shape: tuple[int, int] | None,
    bound: Bound,
    narrow: Callable[[RoundMsg], RoundMsg],
    pieces: int = 1,
    early: bool = False,
) -> list[tuple[str, RoundMsg]]:
    """``early``: this member's contribution is a streamed push not whole yet (its pieces in
    ``r.pre_parts``, some of its slices already sent): the owned segment's pieces are summed and sent
    from the pieces here; the rest waits for the push.

    Once every member's part is here and all came whole, compute every segment here (a direct round,
    nothing more to send). Else, as soon as the round is known to be two-hop (some part was cut, or this
    member cut its own), finish every piece of the owned segment whose N slices are summed (built in core
    order as they came, :func:`_absorb`): bound, narrow once (the owner keeps the very bytes the others
    get) and send it to every other member, while later pieces are still arriving (cut-through). Returns
    the messages to send."""
    plan = r.plan
    n, p = len(plan.core), plan.ring_position(site)
    slices = r.ring_slices
    if r.ring_step or (slices is None and not early):
        return []
    recv = r.ap_recv
    two_hop = not r.whole or any(m.segment != WHOLE for m in recv.values())
    if not two_hop and slices is not None:
        if any((q, 0) not in recv for q in range(n) if q != p):
            return []
        whole = {q: recv[(q, 0)] for q in range(n) if q != p}
        ids = merge_ids(r.ring_ids, *(m.sites for m in whole.values()))
        r.ring_step = 1
        for g in range(n):
            parts = [slices[g] if q == p else _slice(whole[q], g, n) for q in range(n)]
            acc = aggregate(parts, peers=[plan.core[q] for q in range(n)])
            r.seg_finals[g] = _finish(r, g, acc, ids, shape, bound, narrow, keep_residual=g == p)
        recv.clear()
        return []
    out: list[tuple[str, RoundMsg]] = []
    b = None if slices is not None or shape is None else piece_bounds(n_blocks(*shape), n, pieces)
    for k in range(pieces):
        own = None if b is None else (int(b[p * pieces + k]), int(b[p * pieces + k + 1]))
        if (p, k) in r.ap_finals or not _absorb(r, p, n, k, pieces, own):
            continue
        senders = [_stored(recv, q, k) for q in range(n) if q != p]
        ids = merge_ids(r.ring_ids, *(m.sites for m in senders if m is not None))
        _, acc = r.ap_sums.pop(k)
        fin = _finish(r, p, acc, ids, shape, bound, narrow, keep_residual=True, k=k)
        r.ap_finals[(p, k)] = fin
        stage_final(r, fin, pieces)
        for q in range(n):
            m = recv.get((q, k))
            if m is not None and m.segment != WHOLE and m.payload is not None:
                del recv[(q, k)]  # summed: drop the slice now (a dense round holds N of them)
        out.extend((s, fin) for s in plan.core if s != site)
    if all((p, k) in r.ap_finals for k in range(pieces)):
        r.ring_step = 1
        recv.clear()
    return out


def allpairs_result(r: OpenRound, pieces: int = 1) -> RoundMsg | None:
    """The round's result once every finished segment (direct round) or piece (two-hop) is here."""
    n = len(r.plan.core)
    if len(r.seg_finals) == n:
        return ring_result(r)
    got = [_stored(r.ap_finals, g, k) for g in range(n) for k in range(pieces)]
    if any(m is None for m in got):
        return None
    fins = [m for m in got if m is not None]
    ids = merge_ids(*(m.sites for m in fins))
    known = next((m.payload for m in fins if m.payload is not None), None)
    payload = None
    if known is not None and r.ap_buf is not None and r.ap_staged == n * pieces:  # see stage_final
        nb, dtype = n_blocks(known.dense_len, known.block_size), known.value_dtype
        idx = np.arange(nb, dtype=np.int64)
        payload = SparsePayload(r.layer, known.dense_len, known.block_size, idx, r.ap_buf, dtype)
    elif known is not None:
        seen: set[int] = set()
        parts = []
        for m in fins:  # an empty finished segment from an owner that knew no shape stands for all pieces
            if m.payload is None:
                if id(m) not in seen:
                    seen.add(id(m))
                    parts.append(SparsePayload.empty(r.layer, known.dense_len, known.block_size))
            else:
                parts.append(m.payload)
        payload = concat_segments(parts)
    return RoundMsg("final", r.iteration, r.layer, r.plan.plan_id, payload, ids)


def allpairs_waiting_on(r: OpenRound, site: str, pieces: int = 1) -> str | None:
    """The first member this one still waits for: a missing slice of a piece not yet finished, then a
    missing finished piece (``None``: nothing is missing)."""
    plan = r.plan
    p = plan.ring_position(site)
    if not r.ring_step:
        for q, s in enumerate(plan.core):
            if q != p and any(
                (p, k) not in r.ap_finals and _stored(r.ap_recv, q, k) is None for k in range(pieces)
            ):
                return s
    if len(r.seg_finals) == len(plan.core):
        return None
    for g, s in enumerate(plan.core):
        if g != p and any(_stored(r.ap_finals, g, k) is None for k in range(pieces)):
            return s
    return None
