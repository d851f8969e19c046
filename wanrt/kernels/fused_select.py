"""Fused selection kernels: block sums, threshold select (one pass over memory), gather, zeroing.

The select kernels read every element exactly once: a block's sum is computed by one vector intrinsic
(:func:`~wanrt.kernels.fused_intrinsics.block_sum16`) while its cache line is in L1, compared with ``v``
and, when it passes, appended to the caller's candidate buffers. With error feedback the residual absorbs
the new gradient in the same pass: block by block with one vector add (:func:`add16`) right before the
block's sum, in the block-16 and element-wise kernels; a chunk of 256 blocks at a time in the generic one.
(A plain ``for i in range(lo, hi)`` add loop stayed scalar under numba: the 256-block chunks of it made the
error-feedback select 2.5 ms for 5 M floats against 1.0 ms block by block; docs/round_bench.md "Session 12".)
The element-wise (vanilla) kernel tests 16 elements per vector compare and only walks the lanes of a
16-group that holds a hit. Sums of other block sizes go through a generic, slower halving tree.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from wanrt.kernels.arrays import Array
from wanrt.kernels.fused_intrinsics import add16, block_sum16, hits16, jit, lowest_bit, prefetch

__all__ = [
    "PREFETCH",
    "block_sums16",
    "block_sums_generic",
    "check_idx",
    "gather",
    "select1",
    "select16",
    "select_generic",
    "zero_blocks",
]

#: blocks per error-feedback add chunk: 256 * 64 B = 16 KiB, inside L1 when the sums read it back
_CHUNK = 256
_FLT_MAX = np.float32(np.finfo(np.float32).max)
#: how many blocks ahead the sparse kernels prefetch (8-16 measured best; 32 starts evicting)
PREFETCH = 12


@jit
def _add_range(x: Array, add: Array, lo: int, hi: int) -> Any:
    i = lo
    while i + 16 <= hi:
        add16(x, add, i)
        i += 16
    for j in range(i, hi):
        x[j] = x[j] + add[j]


@jit
def _tree_sum(x: Array, lo: int, hi: int, width: int, tmp: Array) -> Any:
    """Halving-tree sum of |x[lo:hi]| zero-padded to ``width`` (a power of two), as in the reference."""
    for j in range(width):
        tmp[j] = np.float32(0.0)
    for j in range(hi - lo):
        tmp[j] = abs(x[lo + j])
    h = width // 2
    while h >= 1:
        for j in range(h):
            tmp[j] = tmp[j] + tmp[j + h]
        h //= 2
    return tmp[0]


@jit
def _compact(
    sums: Array, m: int, b0: int, v: np.float32, idx_buf: Array, sum_buf: Array, c: int, bad: bool
) -> Any:
    cap = idx_buf.shape[0]
    for k in range(m):
        s = sums[k]
        if not (s < v):
            if s != s or s > _FLT_MAX:
                bad = True
            if c < cap:
                idx_buf[c] = b0 + k
                sum_buf[c] = s
            c += 1
    return c, bad


@jit
def select16(x: Array, add: Array, use_add: bool, v: np.float32, idx_buf: Array, sum_buf: Array) -> Any:
    """Cache-aware threshold-v: blocks of 16 whose sum passes ``v`` (optionally after ``x += add``)."""
    n = x.shape[0]
    full = n // 16
    cap = idx_buf.shape[0]
    c = 0
    bad = False
    for b in range(full):
        if use_add:
            add16(x, add, b * 16)
        s = block_sum16(x, b * 16)
        if not (s < v):
            if s != s or s > _FLT_MAX:
                bad = True
            if c < cap:
                idx_buf[c] = b
                sum_buf[c] = s
            c += 1
    if full * 16 < n:
        if use_add:
            _add_range(x, add, full * 16, n)
        sums = np.empty(1, np.float32)
        sums[0] = _tree_sum(x, full * 16, n, 16, np.empty(16, np.float32))
        c, bad = _compact(sums, 1, full, v, idx_buf, sum_buf, c, bad)
    return c, bad


@jit
def select_generic(
    x: Array, add: Array, use_add: bool, bs: int, width: int, v: np.float32, idx_buf: Array, sum_buf: Array
) -> Any:
    n = x.shape[0]
    nb = (n + bs - 1) // bs
    sums = np.empty(_CHUNK, np.float32)
    tmp = np.empty(width, np.float32)
    c = 0
    bad = False
    for b0 in range(0, nb, _CHUNK):
        m = min(_CHUNK, nb - b0)
        if use_add:
            _add_range(x, add, b0 * bs, min(n, (b0 + m) * bs))
        for k in range(m):
            lo = (b0 + k) * bs
            sums[k] = _tree_sum(x, lo, min(n, lo + bs), width, tmp)
        c, bad = _compact(sums, m, b0, v, idx_buf, sum_buf, c, bad)
    return c, bad


@jit
def select1(x: Array, add: Array, use_add: bool, v: np.float32, idx_buf: Array, sum_buf: Array) -> Any:
    """Vanilla (element-wise) threshold-v: one vector compare per 16 elements, lanes walked on a hit."""
    n = x.shape[0]
    full = n - n % 16
    cap = idx_buf.shape[0]
    c = 0
    bad = False
    for o in range(0, full, 16):
        if use_add:
            add16(x, add, o)
        mask = hits16(x, o, v)
        while mask != 0:
            j = lowest_bit(mask)
            mask &= mask - 1
            s = abs(x[o + j])
            if s != s or s > _FLT_MAX:
                bad = True
            if c < cap:
                idx_buf[c] = o + j
                sum_buf[c] = s
            c += 1
    for i in range(full, n):
        if use_add:
            x[i] = x[i] + add[i]
        s = abs(x[i])
        if not (s < v):
            if s != s or s > _FLT_MAX:
                bad = True
            if c < cap:
                idx_buf[c] = i
                sum_buf[c] = s
            c += 1
    return c, bad


@jit
def block_sums16(x: Array, out: Array) -> Any:
    n = x.shape[0]
    full = n // 16
    for b in range(full):
        out[b] = block_sum16(x, b * 16)
    if full * 16 < n:
        out[full] = _tree_sum(x, full * 16, n, 16, np.empty(16, np.float32))


@jit
def block_sums_generic(x: Array, bs: int, width: int, out: Array) -> Any:
    n = x.shape[0]
    tmp = np.empty(width, np.float32)
    for b in range(out.shape[0]):
        lo = b * bs
        out[b] = _tree_sum(x, lo, min(n, lo + bs), width, tmp)


@jit
def check_idx(idx: Array, nb: int) -> Any:
    """0 if every index is in [0, nb) and strictly increasing; 1 out of range; 2 not increasing."""
    prev = -1
    for j in range(idx.shape[0]):
        b = idx[j]
        if b < 0 or b >= nb:
            return 1
        if b <= prev:
            return 2
        prev = b
    return 0


@jit
def gather(x: Array, idx: Array, bs: int, out: Array) -> Any:
    n = x.shape[0]
    k = idx.shape[0]
    for j in range(k):
        if j + PREFETCH < k:
            prefetch(x, idx[j + PREFETCH] * bs)
        o = idx[j] * bs
        if bs == 16 and o + 16 <= n:
            for e in range(16):
                out[j * 16 + e] = x[o + e]
            continue
        lim = min(bs, n - o)
        for e in range(lim):
            out[j * bs + e] = x[o + e]
        for e in range(lim, bs):
            out[j * bs + e] = np.float32(0.0)


@jit
def zero_blocks(x: Array, idx: Array, bs: int) -> Any:
    n = x.shape[0]
    k = idx.shape[0]
    for j in range(k):
        if j + PREFETCH < k:
            prefetch(x, idx[j + PREFETCH] * bs)
        o = idx[j] * bs
        for e in range(min(bs, n - o)):
            x[o + e] = np.float32(0.0)
