"""Exact sparse aggregation of COO payloads, and the bounded-forwarding policies of a gateway.

Why sparse and exact. Across the WAN a gateway only ever holds a few percent of each layer (cache-aware
threshold-v keeps 16-float blocks, StellaTrain §3.2), so summing in the COO domain — a k-way merge of sorted
block indices and a segmented sum of the matching blocks — touches O(nnz) memory instead of the dense
length; ``tools/bench_rounds.py`` measures this against a dense ``np.add``. Values are always summed in fp32
whatever the wire dtype, and blocks with the same index are added in input order, so every gateway that
sums the same inputs in the same order gets bit-identical results.

Why bounded forwarding. The union of N sites' top-k/N blocks grows towards k blocks, and an aggregate of
aggregates can keep growing; StellaTrain §6 ("Optimizing collectives in multi-strategy space") bounds the
update by letting each of the N sites contribute its top k/N blocks. Two policies are offered here:

* :func:`per_site_cap` — the StellaTrain §6 budget: a site forwards at most ``ceil(density·n_blocks/N)``
  blocks of its own contribution;
* :func:`aggregate_cap` — re-sparsify an aggregate to ``ceil(density·n_blocks)`` blocks.

Both split with :func:`top_blocks`, which never loses mass: what is not forwarded is returned as a
remainder that the caller keeps in a per-layer residual and adds to its next contribution (the gateway's
error feedback), so ``kept + remainder == input`` exactly (disjoint blocks, no arithmetic).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from wanrt.errors import KernelError, MalformedPayload
from wanrt.payload import VALUE_DTYPES, SparsePayload, n_blocks

__all__ = [
    "aggregate",
    "aggregate_cap",
    "concat_segments",
    "per_site_cap",
    "segment_bounds",
    "split_segments",
    "top_blocks",
]


#: Below this ratio of n_blocks to summed input blocks, a dense scratch of the layer's blocks is cheaper than
#: merging sorted indices (few large NumPy calls instead of a sort); both paths add in input order, so they
#: return bit-identical results.
_DENSE_SCRATCH_FACTOR = 4


def _aggregate_scratch(payloads: Sequence[SparsePayload], nb: int) -> SparsePayload:
    first = payloads[0]
    bs = first.block_size
    # -0.0 is the exact identity of IEEE addition (-0.0 + x == x for every x, +0.0 and -0.0 included), so
    # a block's first addend lands unchanged, as in the merge path (0.0 + -0.0 would give +0.0)
    acc = np.full((nb, bs), -0.0, dtype=np.float32)
    hit = np.zeros(nb, dtype=bool)
    for p in payloads:  # one vectorised step per payload; indices are unique within each payload
        acc[p.indices] += p.values_f32().reshape(-1, bs)
        hit[p.indices] = True
    idx = np.flatnonzero(hit)
    return SparsePayload(first.layer, first.dense_len, bs, idx, acc[idx].reshape(-1), "fp32")


def _same_full_range(payloads: Sequence[SparsePayload]) -> bool:
    """Every payload selects every block of one contiguous range (a dense layer, or a dense ring or
    all-pairs segment): O(1) per payload, since indices are strictly increasing."""
    first = payloads[0].indices
    k = first.shape[0]
    lo, hi = int(first[0]), int(first[-1])
    if hi - lo + 1 != k:
        return False
    for p in payloads[1:]:
        idx = p.indices
        if idx.shape[0] != k or int(idx[0]) != lo or int(idx[-1]) != hi:
            return False
    return True


def _f32(p: SparsePayload) -> npt.NDArray[np.float32]:
    """A payload's values as fp32 for adding: the array itself when it is fp32, else one widened copy
    (``astype`` is NumPy's fastest fp16 path, ~2x faster than widening inside ``np.add(..., dtype=)``)."""
    return p.values if p.value_dtype == "fp32" else p.values_f32()


def _aggregate_dense(payloads: Sequence[SparsePayload]) -> SparsePayload:
    """Plain vector adds in input order — the order the general paths add each block in, so the result is
    bit-identical to theirs — with the shared indices reused (no union, no sort, no scratch)."""
    first = payloads[0]
    if first.value_dtype == "fp32":
        out = np.add(first.values, _f32(payloads[1]))
        rest = payloads[2:]
    else:
        out = first.values_f32()  # a new array: the sum is built in place in it
        rest = payloads[1:]
    for p in rest:
        np.add(out, _f32(p), out=out)
    return SparsePayload(first.layer, first.dense_len, first.block_size, first.indices, out, "fp32")


def _as_f32(p: SparsePayload) -> SparsePayload:
    if p.value_dtype == "fp32":
        return p
    return SparsePayload(p.layer, p.dense_len, p.block_size, p.indices, p.values_f32(), "fp32")


def aggregate(
    payloads: Sequence[SparsePayload | None],
    *,
    peers: Sequence[str | None] | None = None,
    keep_dtype: bool = False,
) -> SparsePayload | None:
    """The exact sum of ``payloads`` as one fp32 payload (``None`` entries are empty contributions).

    All payloads must describe the same layer with the same ``dense_len`` and ``block_size``; a mismatch is
    the sender's fault and raises :class:`MalformedPayload` naming ``peers[i]`` of the offending one. Returns
    ``None`` only when every entry is ``None`` (nothing is known about the layer's shape).

    ``keep_dtype``: a lone non-empty input is returned as it is, in its own dtype, instead of widened to
    fp32 — for a gateway that forwards its trainers' fp16 push unchanged, where widening and narrowing
    again would cost two passes over the values and give back the same bits. Inputs that all select every
    block of one range (dense layers, dense segments) are summed as plain vector adds.
    """
    first: SparsePayload | None = None
    nonempty: list[SparsePayload] = []
    for i, p in enumerate(payloads):
        if p is None:
            continue
        if first is None:
            first = p
        elif p.dense_len != first.dense_len or p.block_size != first.block_size or p.layer != first.layer:
            raise MalformedPayload(
                f"layer {p.layer}: shape (dense_len={p.dense_len}, block_size={p.block_size}) disagrees "
                f"with layer {first.layer} (dense_len={first.dense_len}, block_size={first.block_size})",
                peer=peers[i] if peers is not None else None,
                value=(p.layer, p.dense_len, p.block_size),
            )
        if p.indices.shape[0]:
            nonempty.append(p)
    if first is None:
        return None
    if not nonempty:
        return SparsePayload.empty(first.layer, first.dense_len, first.block_size)
    if len(nonempty) == 1:
        return nonempty[0] if keep_dtype else _as_f32(nonempty[0])
    if _same_full_range(nonempty):
        return _aggregate_dense(nonempty)
    bs = first.block_size
    total = sum(p.indices.shape[0] for p in nonempty)
    nb = n_blocks(first.dense_len, bs)
    if nb <= _DENSE_SCRATCH_FACTOR * total:
        return _aggregate_scratch(nonempty, nb)
    idx = np.concatenate([p.indices for p in nonempty])
    vals = np.concatenate([p.values_f32() for p in nonempty]).reshape(-1, bs)
    # The inputs are sorted runs: a stable sort merges them (timsort finds the runs) and keeps equal
    # indices in input order, which fixes the fp32 summation order.
    order = np.argsort(idx, kind="stable")
    sidx = idx[order]
    new = np.empty(sidx.shape[0], dtype=bool)
    new[0] = True
    np.not_equal(sidx[1:], sidx[:-1], out=new[1:])
    starts = np.flatnonzero(new)
    out_vals = vals[order[starts]]
    if starts.shape[0] < sidx.shape[0]:
        # Add the 2nd, 3rd, ... occurrence of each index in turn. One vectorised pass per rank, at most
        # len(payloads) passes, and within a pass every target row is distinct, so fancy "+=" is exact;
        # (np.add.reduceat along axis 0 is ~3x slower here and sums in a different order).
        gid = np.cumsum(new) - 1
        dup = np.flatnonzero(~new)
        rank = dup - starts[gid[dup]]
        rows = gid[dup]
        src = order[dup]
        for level in range(1, int(rank.max()) + 1):
            at = rank == level
            out_vals[rows[at]] += vals[src[at]]
    return SparsePayload(
        first.layer,
        first.dense_len,
        bs,
        np.ascontiguousarray(sidx[starts]),
        out_vals.reshape(-1),
        "fp32",
    )


def _subset(p: SparsePayload, mask: npt.NDArray[np.bool_]) -> SparsePayload:
    vals = p.values_f32().reshape(-1, p.block_size)[mask].reshape(-1)
    return SparsePayload(p.layer, p.dense_len, p.block_size, p.indices[mask], vals, "fp32")


def top_blocks(p: SparsePayload, max_blocks: int) -> tuple[SparsePayload, SparsePayload]:
    """Split ``p`` into (its ``max_blocks`` blocks of largest L1 magnitude, the rest), both fp32.

    L1 per block is the "cumulative magnitude within each block" that StellaTrain §3.2 ranks blocks by. The
    two parts have disjoint indices and together are exactly ``p``.
    """
    if max_blocks < 0:
        raise KernelError("max_blocks must be >= 0", value=max_blocks)
    p32 = _as_f32(p)
    nb = p32.nnz_blocks
    if nb <= max_blocks:
        return p32, SparsePayload.empty(p.layer, p.dense_len, p.block_size)
    mag = np.abs(p32.values.reshape(-1, p.block_size)).sum(axis=1)
    mask = np.zeros(nb, dtype=bool)
    if max_blocks > 0:
        mask[np.argpartition(mag, nb - max_blocks)[nb - max_blocks :]] = True
    return _subset(p32, mask), _subset(p32, ~mask)


def per_site_cap(dense_len: int, block_size: int, density: float, n_sites: int) -> int:
    """StellaTrain §6 budget: each of ``n_sites`` sites forwards at most ``ceil(k/N)`` blocks, with
    ``k = density · n_blocks``, so the union over all sites stays within k blocks."""
    k = density * n_blocks(dense_len, block_size)
    return max(1, math.ceil(k / max(1, n_sites)))


def aggregate_cap(dense_len: int, block_size: int, density: float) -> int:
    """Block budget of a re-sparsified aggregate: ``ceil(density · n_blocks)`` (at least one block)."""
    return max(1, math.ceil(density * n_blocks(dense_len, block_size)))


@functools.lru_cache(maxsize=1024)
def segment_bounds(total_blocks: int, n: int) -> npt.NDArray[np.int64]:
    """``n + 1`` boundaries cutting ``[0, total_blocks)`` into ``n`` contiguous, near-equal segments.

    Segment ``g`` is ``[bounds[g], bounds[g+1])``; used by the ring's reduce-scatter, so every ring member
    computing it from the same layer shape gets the same cut. The result is cached and read-only.
    """
    if n < 1:
        raise KernelError("a ring needs at least one segment", value=n)
    out = (np.arange(n + 1, dtype=np.int64) * total_blocks) // n
    out.flags.writeable = False
    return out


def split_segments(
    p: SparsePayload, bounds: npt.NDArray[np.int64], *, keep_dtype: bool = False
) -> list[SparsePayload]:
    """Cut ``p`` at ``bounds`` (see :func:`segment_bounds`) into payloads that share its memory: fp32, or
    with ``keep_dtype`` in ``p``'s own dtype (no conversion at all: each segment is a view)."""
    src = p if keep_dtype else _as_f32(p)
    cuts = np.searchsorted(src.indices, bounds)
    bs = p.block_size
    out: list[SparsePayload] = []
    for g in range(bounds.shape[0] - 1):
        a, b = int(cuts[g]), int(cuts[g + 1])
        out.append(
            SparsePayload(
                p.layer, p.dense_len, bs, src.indices[a:b], src.values[a * bs : b * bs], src.value_dtype
            )
        )
    return out


def concat_segments(parts: Sequence[SparsePayload]) -> SparsePayload:
    """Join segment payloads given in segment order (the all-gather step of the ring) into one payload.

    The result keeps the value dtype the non-empty segments share (a result made of fp16 segments stays
    fp16: no widening pass and no narrowing pass after it); mixed dtypes are joined in fp32."""
    if not parts:
        raise KernelError("nothing to concatenate")
    first = parts[0]
    last = -1
    for p in parts:
        if (p.layer, p.dense_len, p.block_size) != (first.layer, first.dense_len, first.block_size):
            raise KernelError("segments of different layers or shapes", value=p.layer)
        if p.nnz_blocks:
            if int(p.indices[0]) <= last:
                raise KernelError("segments overlap or are out of order", value=int(p.indices[0]))
            last = int(p.indices[-1])
    dtypes = {p.value_dtype for p in parts if p.nnz_blocks}
    dtype = dtypes.pop() if len(dtypes) == 1 else "fp32"
    idx: Any = np.concatenate([p.indices for p in parts])
    if dtype == "fp32":
        vals: Any = np.concatenate([p.values_f32() for p in parts])
    else:  # empty parts may be of any dtype: their zero values convert trivially
        vals = np.concatenate(
            [p.values if p.value_dtype == dtype else p.values.astype(VALUE_DTYPES[dtype]) for p in parts]
        )
    return SparsePayload(first.layer, first.dense_len, first.block_size, idx, vals, dtype)
