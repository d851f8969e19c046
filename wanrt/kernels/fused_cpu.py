"""The fused CPU path (``WANRT_KERNELS=fused``, the default on host arrays): numba kernels.

Why numba, and why fused (measured on this 2-core Xeon, 25M fp32 = 100 MB, see docs/kernels.md):

* NumPy needs several passes and temporaries for a block threshold (``abs`` -> 100 MB temporary, a 16-wide
  reduction with per-row overhead, a compare, ``nonzero``): ~100 ms, ~1 GB/s, while one read pass over
  memory costs ~11 ms. The fused kernel reads each block once, computes its sum, compares and appends the
  passing ones, all while the 64-byte line is in L1: ~15-20 ms, within 1.5x of ``np.copyto``.
* numba over a C extension: no build step, no compiler on the target, and the kernels stay next to their
  Python reference. Compilation happens on first use (about 1-2 s per kernel) and is cached on disk
  (``cache=True``: next to this file, or under ``NUMBA_CACHE_DIR`` / the user cache when this directory is
  read-only; with no writable location at all caching is simply turned off). ``nogil=True`` lets a trainer
  compress one layer while another thread does something else.
* numba disables LLVM's SLP vectoriser (it miscompiled, numba#8705), so a 16-element tree written
  straight-line stays scalar. The select kernels therefore work in two phases per chunk of 256 blocks
  (16 KiB, in L1): phase A computes the block sums with a loop over *blocks* that LLVM's loop vectoriser
  does vectorise (8 blocks per AVX register), phase B compacts the passing ones (one compare per block).
  Both read the chunk while it is in cache, so memory is still read exactly once.

The block sums use the same halving-tree order as the reference (:mod:`wanrt.kernels.reference`), without
fast-math, so the sums — and therefore the selections — are bit-identical to the NumPy path. Optimizer
kernels validate every index (range, strictly increasing) before writing anything: a bad index returns an
error code that becomes a :class:`~wanrt.errors.KernelError`, never a wild write.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numba
import numpy as np
from llvmlite import ir  # type: ignore[import-untyped]  # ships without type information
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from wanrt.errors import KernelError
from wanrt.kernels.arrays import Array
from wanrt.kernels.reference import BiasTables, ReferenceKernels, next_pow2
from wanrt.payload import n_blocks

__all__ = ["CACHING", "FusedKernels"]

F = TypeVar("F", bound=Callable[..., Any])

#: blocks per phase-A chunk: 256 * 64 B = 16 KiB of input plus 1 KiB of sums, comfortably inside L1
_CHUNK = 256
_FLT_MAX = np.float32(np.finfo(np.float32).max)
_INF = np.float32(np.inf)

#: whether compiled kernels are cached on disk (False when no writable cache location exists)
CACHING = True


def _jit(fn: F) -> F:
    """``numba.njit`` with on-disk caching when a cache location is writable, without it otherwise."""
    global CACHING
    opts: dict[str, Any] = {"nogil": True, "boundscheck": False, "error_model": "numpy"}
    try:
        return numba.njit(cache=CACHING, **opts)(fn)
    except RuntimeError:  # "cannot cache function ...: no locator available"
        CACHING = False
        return numba.njit(cache=False, **opts)(fn)


# ---------------------------------------------------------------------------------------- block sums


@_jit
def _sums16(x: Array, b0: int, m: int, out: Array) -> Any:
    for k in range(m):
        o = (b0 + k) * 16
        a0 = abs(x[o]) + abs(x[o + 8])
        a1 = abs(x[o + 1]) + abs(x[o + 9])
        a2 = abs(x[o + 2]) + abs(x[o + 10])
        a3 = abs(x[o + 3]) + abs(x[o + 11])
        a4 = abs(x[o + 4]) + abs(x[o + 12])
        a5 = abs(x[o + 5]) + abs(x[o + 13])
        a6 = abs(x[o + 6]) + abs(x[o + 14])
        a7 = abs(x[o + 7]) + abs(x[o + 15])
        out[k] = ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))


@_jit
def _add_range(x: Array, add: Array, lo: int, hi: int) -> Any:
    for i in range(lo, hi):
        x[i] = x[i] + add[i]


@_jit
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


@_jit
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


@_jit
def _select16(x: Array, add: Array, use_add: bool, v: np.float32, idx_buf: Array, sum_buf: Array) -> Any:
    n = x.shape[0]
    full = n // 16
    sums = np.empty(_CHUNK, np.float32)
    c = 0
    bad = False
    for b0 in range(0, full, _CHUNK):
        m = min(_CHUNK, full - b0)
        if use_add:
            _add_range(x, add, b0 * 16, (b0 + m) * 16)
        _sums16(x, b0, m, sums)
        c, bad = _compact(sums, m, b0, v, idx_buf, sum_buf, c, bad)
    if full * 16 < n:
        if use_add:
            _add_range(x, add, full * 16, n)
        sums[0] = _tree_sum(x, full * 16, n, 16, np.empty(16, np.float32))
        c, bad = _compact(sums, 1, full, v, idx_buf, sum_buf, c, bad)
    return c, bad


@_jit
def _select_generic(
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


@_jit
def _select1(x: Array, add: Array, use_add: bool, v: np.float32, idx_buf: Array, sum_buf: Array) -> Any:
    """Element-wise threshold (vanilla threshold-v): one compare per element, append the hits.

    A plain loop measured fastest: skipping hit-free groups with a vectorised pre-check (any/max/count
    over 16 or 64 elements) cost more than it saved at 1 % density, where ~15 % of 16-groups hold a hit.
    """
    n = x.shape[0]
    cap = idx_buf.shape[0]
    c = 0
    bad = False
    for i in range(n):
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


@_jit
def _block_sums16(x: Array, out: Array) -> Any:
    n = x.shape[0]
    full = n // 16
    for b0 in range(0, full, _CHUNK):
        _sums16(x, b0, min(_CHUNK, full - b0), out[b0:])
    if full * 16 < n:
        out[full] = _tree_sum(x, full * 16, n, 16, np.empty(16, np.float32))


@_jit
def _block_sums_generic(x: Array, bs: int, width: int, out: Array) -> Any:
    n = x.shape[0]
    tmp = np.empty(width, np.float32)
    for b in range(out.shape[0]):
        lo = b * bs
        out[b] = _tree_sum(x, lo, min(n, lo + bs), width, tmp)


# ---------------------------------------------------------------------------------------- gather / scatter


@_jit
def _check_idx(idx: Array, nb: int) -> Any:
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


def _prefetch_intrinsic(typingctx: Any, arr: Any, i: Any) -> Any:
    """``llvm.prefetch`` of ``&arr[i]`` for writing, into all cache levels; never faults.

    A sparse update is a chain of independent random accesses (parameter, moments, step counter of each
    block); the out-of-order window alone keeps only a couple of them in flight, so the kernels prefetch
    the lines of the block ``_PREFETCH`` positions ahead: measured 2x (Adam) to 4x (SGD) on 15625 random
    blocks of a 25M-element tensor.
    """
    sig = types.void(arr, i)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = builder.gep(ary.data, [args[1]])
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [cgutils.voidptr_t, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [builder.bitcast(ptr, cgutils.voidptr_t), i32(1), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


_prefetch: Any = intrinsic(_prefetch_intrinsic)

#: how many blocks ahead the sparse kernels prefetch (8-16 measured best; 32 starts evicting)
_PREFETCH = 12


@_jit
def _gather(x: Array, idx: Array, bs: int, out: Array) -> Any:
    n = x.shape[0]
    k = idx.shape[0]
    for j in range(k):
        if j + _PREFETCH < k:
            _prefetch(x, idx[j + _PREFETCH] * bs)
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


@_jit
def _zero_blocks(x: Array, idx: Array, bs: int) -> Any:
    n = x.shape[0]
    k = idx.shape[0]
    for j in range(k):
        if j + _PREFETCH < k:
            _prefetch(x, idx[j + _PREFETCH] * bs)
        o = idx[j] * bs
        for e in range(min(bs, n - o)):
            x[o + e] = np.float32(0.0)


@_jit
def _scatter_add(dense: Array, idx: Array, vals: Array, bs: int, scale: float) -> Any:
    n = dense.shape[0]
    err = _check_idx(idx, (n + bs - 1) // bs)
    if err:
        return err
    s = np.float32(scale)
    k = idx.shape[0]
    for j in range(k):
        if j + _PREFETCH < k:
            _prefetch(dense, idx[j + _PREFETCH] * bs)
        o = idx[j] * bs
        if bs == 16 and o + 16 <= n:
            for e in range(16):
                dense[o + e] = dense[o + e] + s * vals[j * 16 + e]
            continue
        for e in range(min(bs, n - o)):
            dense[o + e] = dense[o + e] + s * vals[j * bs + e]
    return 0


@_jit
def _sgd_elem(p: Array, pos: int, g: np.float32, neg_lr: np.float32, wd32: np.float32) -> None:
    x = p[pos]
    p[pos] = x + neg_lr * (g + wd32 * x)


@_jit
def _sgd(p: Array, idx: Array, vals: Array, bs: int, lr: float, wd: float) -> Any:
    n = p.shape[0]
    err = _check_idx(idx, (n + bs - 1) // bs)
    if err:
        return err
    neg_lr = np.float32(-lr)
    wd32 = np.float32(wd)
    k = idx.shape[0]
    for j in range(k):
        if j + _PREFETCH < k:
            _prefetch(p, idx[j + _PREFETCH] * bs)
        o = idx[j] * bs
        if wd == 0.0:  # p + (-lr) * g, exactly as the reference (no "+ 0 * p")
            if bs == 16 and o + 16 <= n:
                for e in range(16):
                    p[o + e] = p[o + e] + neg_lr * vals[j * 16 + e]
                continue
            for e in range(min(bs, n - o)):
                p[o + e] = p[o + e] + neg_lr * vals[j * bs + e]
        elif bs == 16 and o + 16 <= n:
            for e in range(16):
                _sgd_elem(p, o + e, vals[j * 16 + e], neg_lr, wd32)
        else:
            for e in range(min(bs, n - o)):
                _sgd_elem(p, o + e, vals[j * bs + e], neg_lr, wd32)
    return 0


@_jit
def _momentum_elem(
    p: Array,
    buf: Array,
    pos: int,
    g: np.float32,
    first: bool,
    neg_lr: np.float32,
    mu32: np.float32,
    damp32: np.float32,
    nesterov: bool,
    wd: float,
    wd32: np.float32,
) -> None:
    if wd != 0.0:
        g = g + wd32 * p[pos]
    mb = g if first else mu32 * buf[pos] + damp32 * g
    buf[pos] = mb
    d = g + mu32 * mb if nesterov else mb
    p[pos] = p[pos] + neg_lr * d


@_jit
def _momentum(
    p: Array,
    buf: Array,
    steps: Array,
    idx: Array,
    vals: Array,
    bs: int,
    lr: float,
    mu: float,
    dampening: float,
    nesterov: bool,
    wd: float,
) -> Any:
    n = p.shape[0]
    err = _check_idx(idx, (n + bs - 1) // bs)
    if err:
        return err
    neg_lr = np.float32(-lr)
    mu32 = np.float32(mu)
    damp32 = np.float32(1.0 - dampening)
    wd32 = np.float32(wd)
    k = idx.shape[0]
    for j in range(k):
        if j + _PREFETCH < k:
            q = idx[j + _PREFETCH]
            _prefetch(p, q * bs)
            _prefetch(buf, q * bs)
            _prefetch(steps, q)
        b = idx[j]
        first = steps[b] == 0
        steps[b] += 1
        o = b * bs
        if bs == 16 and o + 16 <= n:
            for e in range(16):
                _momentum_elem(
                    p, buf, o + e, vals[j * 16 + e], first, neg_lr, mu32, damp32, nesterov, wd, wd32
                )
        else:
            for e in range(min(bs, n - o)):
                _momentum_elem(
                    p, buf, o + e, vals[j * bs + e], first, neg_lr, mu32, damp32, nesterov, wd, wd32
                )
    return 0


@_jit
def _adam_elem(
    p: Array,
    m: Array,
    v: Array,
    pos: int,
    g: np.float32,
    step_size: np.float32,
    bc2_sqrt: np.float32,
    w1: np.float32,
    b2: np.float32,
    omb2: np.float32,
    eps32: np.float32,
    wd: float,
    wd32: np.float32,
    decoupled: bool,
    decay: np.float32,
) -> None:
    x = p[pos]
    if wd != 0.0:
        if decoupled:
            x = x * decay
        else:
            g = g + wd32 * x
    mm = m[pos]
    mm = mm + w1 * (g - mm)
    vv = v[pos] * b2
    vv = vv + (omb2 * g) * g
    m[pos] = mm
    v[pos] = vv
    p[pos] = x - step_size * (mm / (np.sqrt(vv) / bc2_sqrt + eps32))


@_jit
def _adam(
    p: Array,
    m: Array,
    v: Array,
    steps: Array,
    idx: Array,
    vals: Array,
    bs: int,
    lr: float,
    bc1: Array,
    bc2_sqrt: Array,
    beta1: float,
    beta2: float,
    eps: float,
    wd: float,
    decoupled: bool,
) -> Any:
    n = p.shape[0]
    err = _check_idx(idx, (n + bs - 1) // bs)
    if err:
        return err
    w1 = np.float32(1.0 - beta1)
    b2 = np.float32(beta2)
    omb2 = np.float32(1.0 - beta2)
    wd32 = np.float32(wd)
    eps32 = np.float32(eps)
    decay = np.float32(1.0 - lr * wd)
    k = idx.shape[0]
    for j in range(k):
        if j + _PREFETCH < k:
            q = idx[j + _PREFETCH]
            _prefetch(p, q * bs)
            _prefetch(m, q * bs)
            _prefetch(v, q * bs)
            _prefetch(steps, q)
        b = idx[j]
        t = steps[b] + 1
        if t >= bc1.shape[0]:  # the caller's bound on step counts was wrong: refuse, do not read past
            return 3
        steps[b] = t
        ss = np.float32(lr / bc1[t])
        bc = np.float32(bc2_sqrt[t])
        o = b * bs
        if bs == 16 and o + 16 <= n:
            for e in range(16):
                _adam_elem(
                    p, m, v, o + e, vals[j * 16 + e], ss, bc, w1, b2, omb2, eps32, wd, wd32, decoupled, decay
                )
        else:
            for e in range(min(bs, n - o)):
                _adam_elem(
                    p, m, v, o + e, vals[j * bs + e], ss, bc, w1, b2, omb2, eps32, wd, wd32, decoupled, decay
                )
    return 0


# ---------------------------------------------------------------------------------------- the path object

_ERRORS = {
    1: "update block index out of range",
    2: "update block indices are not strictly increasing",
    3: "a block's step count exceeds the bias-correction table (corrupt optimizer state?)",
}


def _raise_on(err: int, nb: int) -> None:
    if err:
        raise KernelError(_ERRORS.get(int(err), "bad update indices"), limit=nb)


def _i64(idx: Array) -> Array:
    return np.ascontiguousarray(idx, dtype=np.int64)


def _f32(vals: Array) -> Array:
    return np.ascontiguousarray(vals, dtype=np.float32)


class FusedKernels(ReferenceKernels):
    """The fused numba kernels behind the reference's interface (anything not overridden is the reference)."""

    def __init__(self) -> None:
        super().__init__(np, "fused")

    def block_sums(self, x: Array, bs: int) -> Array:
        if bs == 1:
            return np.abs(x)
        out = np.empty(n_blocks(int(x.shape[0]), bs), dtype=np.float32)
        if bs == 16:
            _block_sums16(x, out)
        else:
            _block_sums_generic(x, bs, next_pow2(bs), out)
        return out

    def select_above(
        self, x: Array, v: float, bs: int, idx_buf: Array, sum_buf: Array, add: Array | None = None
    ) -> tuple[int, bool]:
        use_add = add is not None
        a = add if add is not None else x[:0]
        v32 = np.float32(v)
        if bs == 16:
            c, bad = _select16(x, a, use_add, v32, idx_buf, sum_buf)
        elif bs == 1:
            c, bad = _select1(x, a, use_add, v32, idx_buf, sum_buf)
        else:
            c, bad = _select_generic(x, a, use_add, bs, next_pow2(bs), v32, idx_buf, sum_buf)
        return int(c), bool(bad)

    def gather(self, x: Array, idx: Array, bs: int) -> Array:
        out = np.empty(int(idx.shape[0]) * bs, dtype=np.float32)
        _raise_on(_check_idx(_i64(idx), n_blocks(int(x.shape[0]), bs)), n_blocks(int(x.shape[0]), bs))
        _gather(x, _i64(idx), bs, out)
        return out

    def zero_blocks(self, x: Array, idx: Array, bs: int) -> None:
        _raise_on(_check_idx(_i64(idx), n_blocks(int(x.shape[0]), bs)), n_blocks(int(x.shape[0]), bs))
        _zero_blocks(x, _i64(idx), bs)

    def scatter_add(self, dense: Array, idx: Array, vals: Array, bs: int, scale: float) -> None:
        err = _scatter_add(dense, _i64(idx), _f32(vals), bs, float(scale))
        _raise_on(err, n_blocks(int(dense.shape[0]), bs))

    def sgd(self, p: Array, idx: Array, vals: Array, bs: int, lr: float, wd: float) -> None:
        _raise_on(_sgd(p, _i64(idx), _f32(vals), bs, float(lr), float(wd)), n_blocks(int(p.shape[0]), bs))

    def momentum(
        self,
        p: Array,
        buf: Array,
        steps: Array,
        idx: Array,
        vals: Array,
        bs: int,
        lr: float,
        mu: float,
        dampening: float,
        nesterov: bool,
        wd: float,
    ) -> None:
        err = _momentum(
            p,
            buf,
            steps,
            _i64(idx),
            _f32(vals),
            bs,
            float(lr),
            float(mu),
            float(dampening),
            bool(nesterov),
            float(wd),
        )
        _raise_on(err, n_blocks(int(p.shape[0]), bs))

    def adam(
        self,
        p: Array,
        m: Array,
        v: Array,
        steps: Array,
        idx: Array,
        vals: Array,
        bs: int,
        lr: float,
        bias: BiasTables,
        t_max: int,
        eps: float,
        wd: float,
        decoupled: bool,
    ) -> None:
        bc1, bc2_sqrt = bias.upto(t_max)
        err = _adam(
            p,
            m,
            v,
            steps,
            _i64(idx),
            _f32(vals),
            bs,
            float(lr),
            bc1,
            bc2_sqrt,
            float(bias.beta1),
            float(bias.beta2),
            float(eps),
            float(wd),
            bool(decoupled),
        )
        _raise_on(err, n_blocks(int(p.shape[0]), bs))
