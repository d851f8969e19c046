"""The fused CPU path (``WANRT_KERNELS=fused``, the default on host arrays): numba kernels.

Why numba, and why fused (measured on this 2-core Xeon, 25M fp32 = 100 MB, see docs/kernels.md):

* NumPy needs several passes and temporaries for a block threshold (``abs`` -> 100 MB temporary, a 16-wide
  reduction with per-row overhead, a compare, ``nonzero``): ~200 ms, while one read pass over memory costs
  ~12 ms. The fused kernel reads each block once, computes its sum, compares and appends the passing ones
  while the 64-byte line is in L1: 16-22 ms, 0.8-1.6x the time of ``np.copyto`` of the same buffer.
* numba over a C extension: no build step, no compiler on the target, and the kernels stay next to their
  Python reference. Compilation happens on first use (10-20 s for all of them) and is cached on disk
  (``cache=True``: next to this file, or under ``NUMBA_CACHE_DIR`` / the user cache when this directory is
  read-only; with no writable location the kernel is compiled uncached). ``nogil=True`` lets a trainer
  compress one layer while another thread does something else.
* The kernels live in :mod:`~wanrt.kernels.fused_select` (block sums, threshold select, gather) and
  :mod:`~wanrt.kernels.fused_optim` (scatter-add, SGD, momentum, Adam); the five LLVM intrinsics they
  need (a vector block sum, a 16-lane threshold mask, count-trailing-zeros, a 16-lane Adam step,
  prefetch) are in
  :mod:`~wanrt.kernels.fused_intrinsics`, because numba keeps LLVM's SLP vectoriser off.

The block sums use the same halving-tree order as the reference (:mod:`wanrt.kernels.reference`), without
fast-math, so the sums — and therefore the selections — are bit-identical to the NumPy path. Optimizer
kernels validate every index (range, strictly increasing) before writing anything: a bad index returns an
error code that becomes a :class:`~wanrt.errors.KernelError`, never a wild write.
"""

from __future__ import annotations

import numpy as np

from wanrt.kernels import fused_optim as fo
from wanrt.kernels import fused_select as fs
from wanrt.kernels.arrays import Array, raise_index_error
from wanrt.kernels.fused_intrinsics import caching
from wanrt.kernels.reference import BiasTables, ReferenceKernels, next_pow2
from wanrt.payload import n_blocks

__all__ = ["FusedKernels", "caching"]


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
            fs.block_sums16(x, out)
        else:
            fs.block_sums_generic(x, bs, next_pow2(bs), out)
        return out

    def select_above(
        self, x: Array, v: float, bs: int, idx_buf: Array, sum_buf: Array, add: Array | None = None
    ) -> tuple[int, bool]:
        use_add = add is not None
        a = add if add is not None else x[:0]
        v32 = np.float32(v)
        if bs == 16:
            c, bad = fs.select16(x, a, use_add, v32, idx_buf, sum_buf)
        elif bs == 1:
            c, bad = fs.select1(x, a, use_add, v32, idx_buf, sum_buf)
        else:
            c, bad = fs.select_generic(x, a, use_add, bs, next_pow2(bs), v32, idx_buf, sum_buf)
        return int(c), bool(bad)

    def gather(self, x: Array, idx: Array, bs: int) -> Array:
        out = np.empty(int(idx.shape[0]) * bs, dtype=np.float32)
        raise_index_error(
            fs.check_idx(_i64(idx), n_blocks(int(x.shape[0]), bs)), n_blocks(int(x.shape[0]), bs)
        )
        fs.gather(x, _i64(idx), bs, out)
        return out

    def zero_blocks(self, x: Array, idx: Array, bs: int) -> None:
        raise_index_error(
            fs.check_idx(_i64(idx), n_blocks(int(x.shape[0]), bs)), n_blocks(int(x.shape[0]), bs)
        )
        fs.zero_blocks(x, _i64(idx), bs)

    def scatter_add(self, dense: Array, idx: Array, vals: Array, bs: int, scale: float) -> None:
        err = fo.scatter_add(dense, _i64(idx), _f32(vals), bs, float(scale))
        raise_index_error(err, n_blocks(int(dense.shape[0]), bs))

    def sgd(self, p: Array, idx: Array, vals: Array, bs: int, lr: float, wd: float) -> None:
        raise_index_error(
            fo.sgd(p, _i64(idx), _f32(vals), bs, float(lr), float(wd)), n_blocks(int(p.shape[0]), bs)
        )

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
        err = fo.momentum(
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
        raise_index_error(err, n_blocks(int(p.shape[0]), bs))

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
        err = fo.adam(
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
        raise_index_error(err, n_blocks(int(p.shape[0]), bs))
