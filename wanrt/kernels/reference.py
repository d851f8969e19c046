"""The reference kernels, written once against the array-module pattern (``xp`` is ``numpy`` or ``cupy``).

This is the definition of what every kernel computes; the fused CPU path (:mod:`wanrt.kernels.fused_cpu`)
must reproduce it bit for bit where the arithmetic allows, and the CuPy path *is* this code with
``xp = cupy``. Clarity beats speed here, but everything is still vectorised and costs O(nnz) where the
kernel is meant to (the sparse optimizers gather and scatter whole rows of the touched blocks only).

Two definitions every path shares:

* **Block sum** (StellaTrain §3.2: a block is a 64-byte cache line of 16 fp32): the sum of ``|x|`` over the
  block, in fp32, by a *halving tree* — the block is zero-padded to the next power of two ``P``, then
  ``a[j] = a[j] + a[j + P/2]`` repeatedly. A fixed order makes the sums reproducible across paths (a block
  sitting exactly on the threshold is selected by every path or by none), and it is the order a SIMD
  machine reduces in anyway. The last, partial block of a tensor is zero-padded the same way.
* **Pass**: a block passes threshold ``v`` when ``not (sum < v)`` — i.e. ``sum >= v``, and NaN passes too so
  that a non-finite gradient is reported instead of silently skipped.

The optimizer updates follow ``torch.optim`` formulas (SGD, SGD+momentum, Adam, AdamW) in fp32 with the
scalar coefficients rounded to fp32, applied to the touched blocks only (§3.1); see
:mod:`wanrt.kernels.sparse_optim` for what "lazy" means for the stateful ones.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import NamedTuple

import numpy as np

from wanrt.errors import KernelError
from wanrt.kernels.arrays import Array, check_block_indices
from wanrt.payload import n_blocks

__all__ = ["BiasTables", "ReferenceKernels", "SelectStats", "next_pow2", "numpy_reference"]


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (n >= 1)."""
    return 1 << (n - 1).bit_length()


class SelectStats(NamedTuple):
    """One threshold-v pass and what its controller reads (:meth:`ReferenceKernels.select_stats`)."""

    #: how many blocks passed (may exceed the candidate buffers)
    passed: int
    #: whether a passing block's sum was NaN or infinite
    nonfinite: bool
    #: the aim-th largest passing sum (None when fewer passed), and how many reach ``ratio`` times it
    aim_v: float | None
    probe: int
    #: the payload's blocks in index order (None when ``passed`` overflowed the buffers or ``nonfinite``)
    ids: Array


class ReferenceKernels:
    """The kernels for one array module. ``name`` is the ``WANRT_KERNELS`` value that selects it."""

    def __init__(self, xp: ModuleType, name: str) -> None:
        self.xp = xp
        self.name = name

    # ------------------------------------------------------------------ selection

    def block_sums(self, x: Array, bs: int) -> Array:
        """fp32 sum of |x| per block by the halving tree (see module docstring); length n_blocks."""
        xp = self.xp
        n = int(x.shape[0])
        if bs == 1:
            return xp.abs(x)
        nb = n_blocks(n, bs)
        full = n // bs
        width = next_pow2(bs)
        if width == bs and full == nb:
            a = xp.abs(x).reshape(nb, bs)
        else:
            a = xp.zeros((nb, width), dtype=xp.float32)
            a[:full, :bs] = xp.abs(x[: full * bs]).reshape(full, bs)
            if full < nb:
                a[full, : n - full * bs] = xp.abs(x[full * bs :])
        while a.shape[1] > 1:
            h = a.shape[1] // 2
            a = a[:, :h] + a[:, h:]
        return xp.ascontiguousarray(a[:, 0])

    def select_above(
        self, x: Array, v: float, bs: int, idx_buf: Array, sum_buf: Array, add: Array | None = None
    ) -> tuple[int, bool]:
        """Blocks whose sum passes ``v``, in index order, into the buffers (as many as fit).

        With ``add``, first ``x += add`` (error feedback: the residual absorbs the new gradient in the same
        pass). Returns ``(number that passed, whether any passing sum was NaN/inf)``; the count may exceed
        the buffers, which then hold the first ``len(idx_buf)`` of them.
        """
        xp = self.xp
        if add is not None:
            x += add
        sums = self.block_sums(x, bs)
        passed = xp.nonzero(~(sums < xp.float32(v)))[0]
        count = int(passed.shape[0])
        keep = min(count, int(idx_buf.shape[0]))
        idx_buf[:keep] = passed[:keep]
        sum_buf[:keep] = sums[passed[:keep]]
        nonfinite = count > 0 and not bool(xp.isfinite(sums[passed]).all())
        return count, nonfinite

    def select_stats(
        self,
        x: Array,
        v: float,
        bs: int,
        idx_buf: Array,
        sum_buf: Array,
        add: Array | None,
        aim: int,
        cap: int,
        ratio: float,
    ) -> SelectStats:
        """Threshold-v's whole step on the device side (StellaTrain §3.2): :meth:`select_above`, then
        :meth:`threshold_stats` and :meth:`trim` on the candidates (ranks ``aim`` and ``cap`` of one
        :meth:`partition`). One method so that a device path can do it all before a single read (the CuPy
        path: one kernel pass and one block, no sort); here it is those methods, in that order."""
        count, bad = self.select_above(x, v, bs, idx_buf, sum_buf, add)
        if bad or count > int(idx_buf.shape[0]):
            return SelectStats(count, bad, None, 0, None)
        ids, sums = idx_buf[:count], sum_buf[:count]
        ranks = [r for r in (aim, cap) if r <= count]
        part = self.partition(sums, [count - r for r in ranks]) if ranks else sums
        aim_v, probe = self.threshold_stats(sums, part, count, aim, v, ratio)
        out = ids.copy() if count <= cap else self.trim(ids, sums, part, count, cap)
        return SelectStats(count, False, aim_v, probe, out)

    def partition(self, a: Array, kth: list[int]) -> Array:
        """``a`` rearranged so that every position in ``kth`` holds the value a full sort would put there
        (what the threshold controller reads its ranks from)."""
        return self.xp.partition(a, kth)

    def top_indices(self, sums: Array, count: int) -> Array:
        """Indices (any order) of ``count`` largest entries of ``sums`` (1 <= count <= len(sums)); NaN
        sorts above everything, so a non-finite entry is always among them."""
        xp = self.xp
        nb = int(sums.shape[0])
        if count >= nb:
            return xp.arange(nb, dtype=xp.int64)
        return xp.argpartition(sums, nb - count)[nb - count :]

    def threshold_stats(
        self, sums: Array, part: Array, count: int, aim: int, v: float, ratio: float
    ) -> tuple[float | None, int]:
        """What threshold-v's controller reads off the ``count`` candidate sums (``part``: them partitioned
        at ``count - aim``): the ``aim``-th largest (None when fewer passed) and how many reach ``ratio``
        times it (times ``v`` when there is none): the local steepness probe of :mod:`wanrt.kernels.aimd`."""
        aim_v = float(part[count - aim]) if count >= aim else None
        probe = int((sums >= self.xp.float32((v if aim_v is None else aim_v) * ratio)).sum())
        return aim_v, probe

    def trim(self, ids: Array, sums: Array, part: Array, count: int, cap: int) -> Array:
        """The ``cap`` candidates with the largest sums, in index order; ties at the cut are taken in index
        order (``part``: the sums partitioned at ``count - cap``; ``cap < count``)."""
        xp = self.xp
        cut = xp.float32(float(part[count - cap]))
        keep = sums > cut
        ties = xp.nonzero(sums == cut)[0]
        keep[ties[: cap - int(keep.sum())]] = True
        return ids[keep]

    # ------------------------------------------------------------------ gather / scatter

    def _split_tail(self, n: int, bs: int, idx: Array) -> tuple[int, Array, bool]:
        full = n // bs
        has_tail = n % bs != 0 and int(idx.shape[0]) > 0 and int(idx[-1]) == full
        return full, (idx[:-1] if has_tail else idx), has_tail

    def gather(self, x: Array, idx: Array, bs: int) -> Array:
        """Values of the given blocks, concatenated; the partial last block is zero-padded."""
        xp = self.xp
        n = int(x.shape[0])
        full, body, has_tail = self._split_tail(n, bs, idx)
        out = xp.zeros(int(idx.shape[0]) * bs, dtype=xp.float32)
        nbody = int(body.shape[0])
        if nbody:
            out[: nbody * bs] = x[: full * bs].reshape(full, bs)[body].reshape(-1)
        if has_tail:
            out[nbody * bs : nbody * bs + n - full * bs] = x[full * bs :]
        return out

    def zero_blocks(self, x: Array, idx: Array, bs: int) -> None:
        """``x[block] = 0`` for the given blocks (what error feedback does with what it just sent)."""
        n = int(x.shape[0])
        full, body, has_tail = self._split_tail(n, bs, idx)
        if int(body.shape[0]):
            x[: full * bs].reshape(full, bs)[body] = 0
        if has_tail:
            x[full * bs :] = 0

    def _apply(
        self,
        n: int,
        bs: int,
        idx: Array,
        vals: Array,
        dense: list[Array],
        fn: Callable[[list[Array], Array, Array], None],
    ) -> None:
        """Run ``fn(rows, grad_rows, block_ids)`` on the touched rows of every dense array, write back.

        Rows are copies (fancy indexing), updated by ``fn`` in place and scattered back; the partial last
        block is handled with views so the positions beyond ``n`` never exist.
        """
        full, body, has_tail = self._split_tail(n, bs, idx)
        nbody = int(body.shape[0])
        if nbody:
            views = [a[: full * bs].reshape(full, bs) for a in dense]
            rows = [v[body] for v in views]
            fn(rows, vals[: nbody * bs].reshape(nbody, bs), body)
            for v, r in zip(views, rows, strict=True):
                v[body] = r
        if has_tail:
            tail = n - full * bs
            rows = [a[full * bs :].reshape(1, tail) for a in dense]
            fn(rows, vals[nbody * bs : nbody * bs + tail].reshape(1, tail), idx[-1:])

    def check_indices(self, idx: Array, nb: int) -> None:
        """Indices must be in range and strictly increasing: a scatter would otherwise corrupt or double."""
        check_block_indices(self.xp, idx, nb)

    def scatter_add(self, dense: Array, idx: Array, vals: Array, bs: int, scale: float) -> None:
        """``dense[block] += scale * vals`` over the given blocks only."""
        self.check_indices(idx, n_blocks(int(dense.shape[0]), bs))
        s = self.xp.float32(scale)

        def fn(rows: list[Array], g: Array, _b: Array) -> None:
            rows[0] += s * g

        self._apply(int(dense.shape[0]), bs, idx, vals, [dense], fn)

    # ------------------------------------------------------------------ optimizers

    def sgd(self, p: Array, idx: Array, vals: Array, bs: int, lr: float, wd: float) -> None:
        """``p -= lr * (g + wd * p)`` on the touched blocks (torch.optim.SGD without momentum)."""
        xp = self.xp
        self.check_indices(idx, n_blocks(int(p.shape[0]), bs))
        neg_lr, wd32 = xp.float32(-lr), xp.float32(wd)

        def fn(rows: list[Array], g: Array, _b: Array) -> None:
            d = g + wd32 * rows[0] if wd else g
            rows[0] += neg_lr * d

        self._apply(int(p.shape[0]), bs, idx, vals, [p], fn)

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
        """torch.optim.SGD with momentum on the touched blocks; ``steps`` counts touches per block."""
        xp = self.xp
        self.check_indices(idx, n_blocks(int(p.shape[0]), bs))
        neg_lr, mu32, damp32, wd32 = (xp.float32(c) for c in (-lr, mu, 1.0 - dampening, wd))

        def fn(rows: list[Array], g: Array, b: Array) -> None:
            prm, mom = rows
            if wd:
                g = g + wd32 * prm
            first = (steps[b] == 0)[:, None]
            steps[b] += 1
            mom[...] = xp.where(first, g, mu32 * mom + damp32 * g)
            d = g + mu32 * mom if nesterov else mom
            prm += neg_lr * d

        self._apply(int(p.shape[0]), bs, idx, vals, [p, buf], fn)

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
        """torch.optim.Adam / AdamW on the touched blocks, bias-corrected by each block's own step count.

        ``t_max`` bounds every step count after this update (the optimizer tracks it, so no O(n) scan).
        """
        xp = self.xp
        self.check_indices(idx, n_blocks(int(p.shape[0]), bs))
        f32 = xp.float32
        beta2 = bias.beta2
        w1, b2, one_m_b2 = f32(1.0 - bias.beta1), f32(beta2), f32(1.0 - beta2)
        wd32, eps32, decay = f32(wd), f32(eps), f32(1.0 - lr * wd)
        bc1, bc2 = bias.upto(t_max, xp)

        def fn(rows: list[Array], g: Array, b: Array) -> None:
            prm, mm, vv = rows
            t = steps[b] + 1
            if int(t.max()) >= int(bc1.shape[0]):
                raise KernelError("a block's step count exceeds the bias-correction table")
            steps[b] = t
            if wd and decoupled:
                prm *= decay
            elif wd:
                g = g + wd32 * prm
            mm += w1 * (g - mm)
            vv *= b2
            vv += (one_m_b2 * g) * g  # torch addcmul order
            step_size = (lr / bc1[t]).astype(xp.float32)[:, None]
            bc2_sqrt = bc2[t].astype(xp.float32)[:, None]
            prm -= step_size * (mm / (xp.sqrt(vv) / bc2_sqrt + eps32))

        self._apply(int(p.shape[0]), bs, idx, vals, [p, m, v], fn)


class BiasTables:
    """``1 - beta1**t`` and ``sqrt(1 - beta2**t)`` for t = 0, 1, ... (fp64), grown by doubling.

    Adam's bias corrections depend only on a block's step count; a table lookup replaces two ``pow`` per
    block in the hot loop, and every path reads the same table, so they agree bit for bit.
    """

    def __init__(self, beta1: float, beta2: float) -> None:
        self.beta1 = beta1
        self.beta2 = beta2
        self._bc1 = np.zeros(0)
        self._bc2_sqrt = np.zeros(0)
        self._device: tuple[Array, Array] | None = None  # CuPy copies of the current tables

    def upto(self, t_max: int, xp: ModuleType = np) -> tuple[Array, Array]:
        """Tables covering every t <= t_max, as arrays of ``xp`` (device copies are made once per growth)."""
        if t_max >= self._bc1.shape[0]:
            size = max(64, 2 * self._bc1.shape[0], t_max + 1)
            t = np.arange(size, dtype=np.float64)
            self._bc1 = 1.0 - np.power(self.beta1, t)
            self._bc2_sqrt = np.sqrt(1.0 - np.power(self.beta2, t))
            self._device = None
        if xp is np:
            return self._bc1, self._bc2_sqrt
        if self._device is None:
            self._device = (xp.asarray(self._bc1), xp.asarray(self._bc2_sqrt))
        return self._device


def numpy_reference() -> ReferenceKernels:
    """The NumPy reference (``WANRT_KERNELS=numpy``)."""
    return ReferenceKernels(np, "numpy")
