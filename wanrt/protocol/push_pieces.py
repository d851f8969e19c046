"""How a trainer cuts one layer's push into :class:`~wanrt.protocol.messages.PushPiece` s (a streamed push).

Why this cut. Under the ``allpairs`` topology with cut-through (``allpairs_chunk_bytes``), the gateway sends
piece ``k`` of segment ``g`` of its contribution to segment ``g``'s owner, piece 0 of every segment first
(:mod:`gateways.rounds.allpairs`). A push streamed in exactly those pieces, in that order, lets the gateway
forward each as it arrives: the first reduce-scatter slices leave after ~1/(N·pieces) of the layer
instead of after all of it. The gateway accepts any disjoint ranges in any order (only how early it can
forward depends on the cut), so a trainer whose hint is stale (the job's core changed) is still correct.

The arithmetic is the gateways' (``segment_bounds`` / ``piece_bounds`` / ``piece_count``), repeated here
because trainers must not import the gateway packages; a test checks that both agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from wanrt.payload import SparsePayload, n_blocks
from wanrt.protocol.messages import PushPiece

__all__ = [
    "PUSH_CUT_KEY",
    "PUSH_OWN_KEY",
    "PushCut",
    "cut_push",
    "push_cut_hint",
    "push_cut_value",
    "stream_pieces",
    "stream_ranges",
]

#: Welcome ``info`` key: ``"n:chunk_bytes"`` — the gateway's all-pairs core size and cut-through piece
#: size, so the trainer cuts its pushes the way the gateway forwards them. Absent: pushes go whole.
PUSH_CUT_KEY: Final = "push_cut"

#: Welcome ``info`` key: the index of the trainer's own gateway in the all-pairs core (the segment it owns
#: and never forwards). The trainer sends that segment's piece last in each group, so the pieces the
#: gateway forwards at once come first (a separate key: a trainer that does not know it keeps the plain
#: order, and "n:chunk_bytes" stays what older trainers parse).
PUSH_OWN_KEY: Final = "push_cut_own"

#: ``(n, chunk_bytes, own)``: what :func:`push_cut_hint` read; ``own`` is -1 where the gateway did not say.
PushCut = tuple[int, int, int]


def push_cut_value(n: int, chunk_bytes: int) -> str:
    """The Welcome ``info`` value for :data:`PUSH_CUT_KEY` (info values are scalars)."""
    return f"{n}:{chunk_bytes}"


#: Bytes of one dense fp32 value: pieces are sized on the dense fp32 layer, as the gateways size them.
_F32: Final = 4

#: Fewer pieces than this in all: not worth streaming.
_MIN_PIECES: Final = 2


def stream_pieces(dense_len: int, block_size: int, n: int, chunk_bytes: int) -> int:
    """Pieces per segment, as ``gateways.rounds.allpairs.piece_count`` computes them."""
    if chunk_bytes <= 0 or n < 1 or block_size < 1:
        return 1
    seg = n_blocks(dense_len, block_size) // n
    if seg <= 1:
        return 1
    return max(1, min(seg, -(-seg * block_size * _F32 // chunk_bytes)))


def stream_ranges(total_blocks: int, n: int, pieces: int, own: int = -1) -> list[tuple[int, int]]:
    """Block ranges of the ``n`` segments cut in ``pieces`` pieces each, piece-major (piece 0 of every
    segment, then piece 1, ...): the order in which the gateway forwards them. Within a group the segments
    follow ``own`` round the core and ``own`` (the gateway's own segment, which it keeps) comes last: its
    piece would only delay the ones the gateway sends on. Empty ranges are left out."""
    seg = [(g * total_blocks) // n for g in range(n + 1)]
    order = [(own + 1 + j) % n for j in range(n)] if 0 <= own < n else list(range(n))
    out: list[tuple[int, int]] = []
    for k in range(pieces):
        for g in order:
            lo, width = seg[g], seg[g + 1] - seg[g]
            a, b = lo + (width * k) // pieces, lo + (width * (k + 1)) // pieces
            if a < b:
                out.append((a, b))
    return out


def push_cut_hint(info: Mapping[str, Any]) -> PushCut | None:
    """``(n, chunk_bytes, own)`` from a gateway's Welcome ``info``, or None (absent or malformed: push
    whole). ``own`` is -1 when :data:`PUSH_OWN_KEY` is absent or out of range (the plain order)."""
    v = info.get(PUSH_CUT_KEY)
    if not isinstance(v, str) or v.count(":") != 1:
        return None
    a, b = v.split(":")
    if not (a.isdigit() and b.isdigit() and len(a) <= 6 and len(b) <= 11):
        return None
    n, chunk = int(a), int(b)
    if not (1 <= n <= 1 << 16 and 0 < chunk <= 1 << 30):
        return None
    own = info.get(PUSH_OWN_KEY)
    if type(own) is not int or not 0 <= own < n:
        own = -1
    return n, chunk, own


def cut_push(
    job: str,
    iteration: int,
    layer: int,
    sender: str,
    payload: SparsePayload,
    hint: PushCut | tuple[int, int],
) -> list[PushPiece] | None:
    """The pieces of ``payload`` in the gateway's forwarding order, or None if it is not worth streaming
    (fewer than two pieces: a small or sparse layer goes as one :class:`~wanrt.protocol.messages.Push`).
    Pieces are views of ``payload``'s arrays (no copy)."""
    n, chunk = hint[0], hint[1]
    own = hint[2] if len(hint) > 2 else -1
    total = n_blocks(payload.dense_len, payload.block_size)
    pieces = stream_pieces(payload.dense_len, payload.block_size, n, chunk)
    # a push the gateway would send whole to every member (a direct round, N·(N-1)·nnz <= n_blocks, as
    # gateways.rounds.allpairs.sends_whole) or smaller than one piece goes whole: only dense-ish layers stream
    if (
        pieces * n < _MIN_PIECES
        or n * (n - 1) * payload.nnz_blocks <= total
        or payload.nnz * payload.values.itemsize < chunk
    ):
        return None
    idx = payload.indices
    bs = payload.block_size
    out: list[PushPiece] = []
    for lo, hi in stream_ranges(total, n, pieces, own):
        a, b = (int(x) for x in idx.searchsorted((lo, hi)))
        part = SparsePayload(
            layer, payload.dense_len, bs, idx[a:b], payload.values[a * bs : b * bs], payload.value_dtype
        )
        out.append(PushPiece(job, iteration, layer, sender, lo, hi, part))
    return out
