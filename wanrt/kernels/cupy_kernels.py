"""The CuPy path (``WANRT_KERNELS=cupy``, the default for CuPy arrays and CUDA tensors): fused CUDA kernels.

The reference with ``xp = cupy`` ran everything as chains of CuPy array operations (a block threshold was
an ``abs``, a 16-wide tree of adds, a compare and a ``nonzero``: several passes over a 100 MB layer and a
temporary each), and its optimizers gathered, updated and scattered rows in ~10 launches with host
round trips. On one H200 that made selection 5× slower than ``torch.topk`` and the sparse optimizers 5-9×
slower than torch's *dense* fused step (issue 26). This path replaces the hot kernels:

* **Threshold selection** (StellaTrain §3.2, block and element), :meth:`CupyKernels.select_stats`: ONE
  kernel reads each block once (adding the new gradient into the residual in the same pass when error
  feedback asks), forms the halving-tree block sum, compares, and writes the passing blocks in index order
  within each CUDA block (warp ballots) into a range reserved with one global atomic; then ONE block of
  1024 threads lays the ranges out in index order, finds the controller's two ranks by radix select and
  trims to ``cap`` (ties in index order). One small device-to-host read (count, non-finite flag, the
  aim-th largest, the probe, the blocks kept) is the only host round trip; no sort.
* **Block sums** (the exact pass and top-k): one kernel, one read pass.
* **Top-k**: ``torch.topk`` through DLPack when torch has CUDA (the fastest top-k at hand), else CuPy's
  ``argpartition``. Ties at the cut may be broken differently from NumPy's ``argpartition``.
* **Partition** (the exact pass's rank, and the reference's own select_stats where the fused one does not
  apply): a radix sort, which is a valid partition at every position, so the values at the asked ranks
  equal the reference's.
* **Sparse SGD / momentum / Adam / AdamW** (§3.1): ONE launch each. The update's indices and values come
  from the host; they are validated there (range, strictly increasing: cheap NumPy on the 1 % that is
  sent) and sent to the device with one asynchronous copy, straight out of the owner's pinned buffer when
  the update was averaged into one (the client does), on a copy stream that overlaps the previous layer's
  kernel (:mod:`wanrt.kernels.cupy_staging`). No device-to-host read per step.

Everything else (gather, zeroing the sent blocks, scatter-add) is the reference's CuPy code, which is
already one or two launches. Results are bit-identical to the NumPy reference (see
:mod:`wanrt.kernels.cupy_source` for how), except for the tie-break of top-k noted above.

Streams: every launch and copy goes on CuPy's *current* stream, so a caller that wraps a call in
``cupy.cuda.ExternalStream(torch_stream.cuda_stream)`` (the client's GPU leader path) keeps the whole
selection on its side stream, and the host reads synchronize that stream only, never the device.
"""

from __future__ import annotations

import threading
from types import ModuleType
from typing import Any

import numpy as np

from wanrt.errors import KernelError
from wanrt.kernels.arrays import Array, check_block_indices
from wanrt.kernels.cupy_source import BLOCKS_SOURCE, OPTIM_SOURCE, SELECT_SOURCE, compile_options
from wanrt.kernels.cupy_staging import PinnedStaging, PinnedUpdate
from wanrt.kernels.reference import BiasTables, ReferenceKernels, SelectStats, next_pow2
from wanrt.payload import n_blocks

__all__ = ["MAX_FUSED_BLOCK", "CupyKernels"]

#: Largest block size the fused selection handles: a thread keeps its block's ``next_pow2(bs)`` partial
#: sums in registers; beyond 64 they would spill to local memory and the reference's vectorised tree is
#: as fast. Larger blocks (up to MAX_BLOCK_SIZE) take the reference's CuPy code.
MAX_FUSED_BLOCK = 64

#: threads per CUDA block of every kernel here (a multiple of the warp; 256 keeps 8 blocks per SM busy)
THREADS = 256

#: block indices travel in the high 32 bits of a sort key
_MAX_KEYED_BLOCKS = 1 << 32


_SOURCE_NAMES = {id(SELECT_SOURCE): "select", id(OPTIM_SOURCE): "optim", id(BLOCKS_SOURCE): "blocks"}

#: threads of the one CUDA block that trims the candidates (32 warps: one ballot per warp per step)
TRIM_THREADS = 1024
#: threads of wanrt_order_cut's one block: exactly 1024 (its scan gives each of 32 lanes 32 threads' runs)
ORDER_THREADS = 1024


def _items(bs: int) -> int:
    """Blocks per thread in the selection: more for small blocks, so each CUDA block covers enough data
    that its single global atomic is amortised (256 * 8 elements at bs 1, 256 * 4 * 16 at bs 16)."""
    return 8 if bs == 1 else 4


def _vec(bs: int, *arrays: Array | None) -> int:
    """1 when whole blocks can be read as ``float4``: the block size is a multiple of 4 and every array
    starts 16-byte aligned (so does every block then); else 0 (scalar loads)."""
    if bs % 4:
        return 0
    return int(all(a is None or a.data.ptr % 16 == 0 for a in arrays))


class _Scratch:
    """One thread's device scratch for :meth:`CupyKernels.select_stats`: the counters (left zero by
    ``wanrt_order_cut``, so no memset launch per selection), the candidates' keys, the ranges' table and
    the stats. Per thread because two threads may select at once (on their own streams); one thread's
    selections follow one another (each ends with a host read of its stats)."""

    def __init__(self, xp: ModuleType) -> None:
        self.xp = xp
        self.device = xp.cuda.runtime.getDevice()
        self.counters = xp.zeros(2, dtype=xp.uint64)
        self.stats = xp.empty(5, dtype=xp.float64)
        self.keys = xp.empty(1024, dtype=xp.uint64)
        self.table = xp.empty(2, dtype=xp.int64)
        #: a selection started and its order-cut has not been seen to finish: the counters may be dirty
        self.dirty = False
        self._pinned = xp.cuda.alloc_pinned_memory(5 * 8)
        self._host = np.frombuffer(self._pinned, np.float64, 5)
        self._host_ptr = int(self._pinned.ptr)

    def read_stats(self) -> tuple[float, ...]:
        """The stats, read into pinned memory and waited for on the current stream only (``.get()`` into
        a new pageable array took 12-16 µs on an H200's host, a twentieth of the whole selection)."""
        rt = self.xp.cuda.runtime
        stream = self.xp.cuda.get_current_stream()
        rt.memcpyAsync(self._host_ptr, self.stats.data.ptr, 5 * 8, rt.memcpyDeviceToHost, stream.ptr)
        stream.synchronize()
        return tuple(float(v) for v in self._host)

    def keys_for(self, cap: int) -> Array:
        if int(self.keys.shape[0]) < cap:
            self.keys = self.xp.empty(cap, dtype=self.xp.uint64)
        return self.keys

    def table_for(self, groups: int) -> Array:
        if int(self.table.shape[0]) < 2 * groups:
            self.table = self.xp.empty(2 * groups, dtype=self.xp.int64)
        return self.table


class CupyKernels(ReferenceKernels):
    """The fused CUDA kernels behind the reference's interface (what is not overridden is the reference)."""

    #: Largest aim (candidates expected per step) that :meth:`select_stats` hands to its one-block
    #: ``wanrt_order_cut``: one SM walks the candidates several times, which beats two multi-block sorts for
    #: the ~20 K of a 25 M-element layer in 16-float blocks at 1 % (0.33 against 0.46 ms on an H200) but
    #: not for the ~310 K of element-wise threshold-v on it (2.2-3.0 against 1.3 ms). Above it the sort path.
    fused_max_aim = 1 << 16

    def __init__(self, cupy: ModuleType) -> None:
        super().__init__(cupy, "cupy")
        self._modules: dict[tuple[str, tuple[str, ...]], Any] = {}
        self._functions: dict[tuple[Any, ...], Any] = {}
        self._lock = threading.Lock()
        self._local = threading.local()  # per-thread selection scratch (_Scratch)
        self._hyper: dict[tuple[Any, ...], tuple[Any, ...]] = {}  # see _remember_hyper
        self._keys: Array = None  # scratch for the selection's packed keys
        self._staging = PinnedStaging(cupy)
        self._staged_idx: Array = None  # the last index array upload_update validated on the host
        self._err: Array = None  # device flag of the optimizer kernels (see raise_pending_errors)
        self._torch: Any = None
        self._torch_checked = False

    # ------------------------------------------------------------------ compilation

    def _function(self, source: str, name: str, **defines: int) -> Any:
        """``name`` from ``source`` compiled with ``defines`` (NVRTC, once per combination)."""
        fkey = (name, *defines.items())  # (no sort here: a call site passes its defines in one order)
        fn = self._functions.get(fkey)  # the hot path: no option strings built, no module lookup
        if fn is not None:
            return fn
        opts = compile_options(**defines)
        key = (_SOURCE_NAMES[id(source)], opts)  # one module per source and defines
        with self._lock:
            mod = self._modules.get(key)
            if mod is None:
                mod = self.xp.RawModule(code=source, options=opts)
                self._modules[key] = mod
            fn = self._functions[fkey] = mod.get_function(name)
        return fn

    def _scratch(self) -> _Scratch:
        """This thread's selection scratch on the current device (new when the last use failed midway)."""
        dev = self.xp.cuda.runtime.getDevice()
        sc: _Scratch | None = getattr(self._local, "scratch", None)
        if sc is None or sc.dirty or sc.device != dev:
            sc = self._local.scratch = _Scratch(self.xp)
        return sc

    def _fused(self, bs: int, n: int) -> bool:
        return bs <= MAX_FUSED_BLOCK and n_blocks(n, bs) < _MAX_KEYED_BLOCKS

    # ------------------------------------------------------------------ selection

    def block_sums(self, x: Array, bs: int) -> Array:
        xp = self.xp
        n = int(x.shape[0])
        if bs == 1:
            return xp.abs(x)
        if not self._fused(bs, n):
            return super().block_sums(x, bs)
        nb = n_blocks(n, bs)
        out = xp.empty(nb, dtype=xp.float32)
        if nb:
            vec = _vec(bs, x)
            fn = self._function(
                SELECT_SOURCE, "wanrt_block_sums", BS=bs, P=next_pow2(bs), ITEMS=1, HAS_ADD=0, VEC=vec
            )
            grid = min(-(-nb // THREADS), 65535 * 4)
            fn((grid,), (THREADS,), (x, np.int64(n), np.int64(nb), out))
        return out

    def _launch_select(
        self, x: Array, v: float, bs: int, cap: int, add: Array | None, scratch: _Scratch | None = None
    ) -> tuple[Array, Array, Array, int]:
        """The one read pass (``wanrt_select``): packed candidate keys (each CUDA block's in index order,
        the blocks' ranges in any order), the counters (passed, non-finite) and the ranges' table. With
        ``scratch``: its zeroed counters, keys and table (every entry gets written: no memset)."""
        xp = self.xp
        n = int(x.shape[0])
        nb = n_blocks(n, bs)
        items = _items(bs)
        groups = max(1, -(-nb // (THREADS * items)))
        if scratch is not None:
            counters, keys, table = scratch.counters, scratch.keys_for(cap), scratch.table_for(groups)
        else:
            counters = xp.zeros(2, dtype=xp.uint64)
            if self._keys is None or int(self._keys.shape[0]) < cap:
                self._keys = xp.empty(max(cap, 1024), dtype=xp.uint64)
            keys, table = self._keys, xp.empty(2 * groups, dtype=xp.int64)
        if nb:
            fn = self._function(
                SELECT_SOURCE,
                "wanrt_select",
                BS=bs,
                P=next_pow2(bs),
                ITEMS=items,
                HAS_ADD=int(add is not None),
                VEC=_vec(bs, x, add),
            )
            other = add if add is not None else x
            fn(
                (groups,),
                (THREADS,),
                (
                    x,
                    other,
                    np.int64(n),
                    np.int64(nb),
                    np.float32(v),
                    keys,
                    np.int64(cap),
                    counters,
                    table,
                ),
            )
        return keys, counters, table, groups

    def select_above(
        self, x: Array, v: float, bs: int, idx_buf: Array, sum_buf: Array, add: Array | None = None
    ) -> tuple[int, bool]:
        """As the reference, in one pass; when more blocks pass than the buffers hold, their contents are
        unspecified (the caller re-selects exactly then, :meth:`ThresholdV._select`)."""
        xp = self.xp
        if not self._fused(bs, int(x.shape[0])):
            return super().select_above(x, v, bs, idx_buf, sum_buf, add)
        cap = int(idx_buf.shape[0])
        keys, counters, _, _ = self._launch_select(x, v, bs, cap, add)
        count, bad = (int(c) for c in counters.get())  # the one host round trip of the selection
        keep = min(count, cap)
        if keep and count <= cap:
            ordered = xp.sort(keys[:keep])
            unpack = self._function(
                SELECT_SOURCE, "wanrt_unpack", BS=bs, P=next_pow2(bs), ITEMS=1, HAS_ADD=0, VEC=0
            )
            unpack((-(-keep // THREADS),), (THREADS,), (ordered, np.int64(keep), idx_buf, sum_buf))
        return count, bool(bad)

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
        """As the reference, in two launches and ONE device-to-host read, with no sort: ``wanrt_select``
        (one read pass), then ``wanrt_order_cut`` (one block: the candidates in index order from the
        ranges' table, the aim-th and cap-th largest by radix select, the probe count and the trim).

        Why: the sort-based path (two radix sorts, a serial trim, three host reads) took 0.46 ms for
        25 M elements on an H200 against a 0.03 ms read pass (issue 26)."""
        xp = self.xp
        if not self._fused(bs, int(x.shape[0])) or aim > self.fused_max_aim:
            return super().select_stats(x, v, bs, idx_buf, sum_buf, add, aim, cap, ratio)
        buffer = int(idx_buf.shape[0])
        scratch = self._scratch()
        scratch.dirty = True  # until wanrt_order_cut has run and left the counters zero
        keys, counters, table, groups = self._launch_select(x, v, bs, buffer, add, scratch)
        out = xp.empty(max(1, min(cap, buffer)), dtype=xp.int64)
        stats = scratch.stats
        fn = self._function(BLOCKS_SOURCE, "wanrt_order_cut", BS=1)
        fn(
            (1,),
            (ORDER_THREADS,),
            (
                keys,
                table,
                np.int64(groups),
                counters,
                np.int64(buffer),
                np.int64(aim),
                np.int64(cap),
                np.float64(ratio),
                np.float64(v),
                idx_buf,
                sum_buf,
                out,
                stats,
            ),
        )
        h = scratch.read_stats()  # the selection's one host round trip
        scratch.dirty = False
        count, bad = int(h[0]), bool(h[1])
        if bad or count > buffer:
            return SelectStats(count, bad, None, 0, None)
        aim_v = None if h[2] < 0 else float(h[2])
        return SelectStats(count, False, aim_v, int(h[3]), out[: int(h[4])])

    def partition(self, a: Array, kth: list[int]) -> Array:
        """A radix sort: a partition at every position, so the values at ``kth`` are the reference's."""
        return self.xp.sort(a)

    def threshold_stats(
        self, sums: Array, part: Array, count: int, aim: int, v: float, ratio: float
    ) -> tuple[float | None, int]:
        """As the reference, in one launch (binary searches in the sorted ``part``) and ONE device-to-host
        read for both numbers (the reference's CuPy code: nine array operations and two reads)."""
        xp = self.xp
        if count < aim:
            return super().threshold_stats(sums, part, count, aim, v, ratio)
        out = xp.empty(2, dtype=xp.float64)
        fn = self._function(BLOCKS_SOURCE, "wanrt_threshold_stats", BS=1)
        fn((1,), (1,), (part, np.int64(count), np.int64(aim), np.float64(ratio), out))
        host = out.get()
        return float(host[0]), int(host[1])

    def trim(self, ids: Array, sums: Array, part: Array, count: int, cap: int) -> Array:
        """As the reference, in one launch and without a host read: exactly ``cap`` candidates pass (the cut
        is the cap-th largest: fewer than ``cap`` are above it, at least ``cap`` reach it), so the output's
        size is known and each kept one goes to its prefix count (``part``: ``sums`` sorted ascending)."""
        out = self.xp.empty(cap, dtype=self.xp.int64)
        fn = self._function(BLOCKS_SOURCE, "wanrt_trim", BS=1)
        fn((1,), (TRIM_THREADS,), (ids, sums, part, np.int64(count), np.int64(cap), out))
        return out

    def gather(self, x: Array, idx: Array, bs: int) -> Array:
        """As the reference, in one launch and without the reference's host read of the last index (to
        learn whether the last block is partial): positions past the end read as zero."""
        idx = self.xp.ascontiguousarray(idx, dtype=self.xp.int64)
        nnzb, n = int(idx.shape[0]), int(x.shape[0])
        out = self.xp.empty(nnzb * bs, dtype=self.xp.float32)
        if nnzb:
            fn = self._function(BLOCKS_SOURCE, "wanrt_gather", BS=bs)
            fn((-(-nnzb * bs // THREADS),), (THREADS,), (x, idx, np.int64(nnzb), np.int64(n), out))
        return out

    def zero_blocks(self, x: Array, idx: Array, bs: int) -> None:
        idx = self.xp.ascontiguousarray(idx, dtype=self.xp.int64)
        nnzb, n = int(idx.shape[0]), int(x.shape[0])
        if nnzb:
            fn = self._function(BLOCKS_SOURCE, "wanrt_zero_blocks", BS=bs)
            fn((-(-nnzb * bs // THREADS),), (THREADS,), (x, idx, np.int64(nnzb), np.int64(n)))

    def _torch_cuda(self) -> Any:
        if not self._torch_checked:
            self._torch_checked = True
            try:
                import torch

                self._torch = torch if torch.cuda.is_available() else None
            except ImportError:  # pragma: no cover - torch is a dependency
                self._torch = None
        return self._torch

    def top_indices(self, sums: Array, count: int) -> Array:
        nb = int(sums.shape[0])
        torch = self._torch_cuda()
        if torch is None or count >= nb:
            return super().top_indices(sums, count)
        t = torch.from_dlpack(sums)
        _, idx = torch.topk(t, count, sorted=False)
        return self.xp.from_dlpack(idx)

    # ------------------------------------------------------------------ optimizers

    def pinned_update(self) -> PinnedUpdate:
        """A pinned host buffer an owner fills an update into in place; :meth:`upload_update` then sends
        it with no host copy (cupy_staging; the client's UpdateApplier keeps one per layer)."""
        return self._staging.pinned_update()

    def upload_update(
        self, idx: np.ndarray, vals: np.ndarray, nb: int, *, checked: bool = False
    ) -> tuple[Array, Array]:
        """Validate a host update's indices on the host (unless ``checked``: the payload's own validation,
        the codec's, passed), then queue one copy of both to the device (on the staging's copy stream; the
        current stream waits for it)."""
        if not checked:
            check_block_indices(np, idx, nb)
        d_i, d_v = self._staging.upload(idx, vals)
        self._staged_idx = d_i
        return d_i, d_v

    def _launched(self, idx: Array) -> None:
        """A kernel reading an uploaded update is queued: reusing its device buffer waits for it."""
        if idx is self._staged_idx:
            self._staging.consumed(idx)

    def check_indices(self, idx: Array, nb: int) -> None:
        if idx is self._staged_idx:
            return  # validated on the host by upload_update before it was copied here
        super().check_indices(idx, nb)

    def _remember_hyper(self, key: tuple[Any, ...], hyper: tuple[Any, ...]) -> None:
        """Keep an optimizer setting's kernel scalars (building ~10 NumPy scalars per launch was a tenth of
        a GPU step's host time); a schedule that changes ``lr`` every step makes a new entry each time, so
        the table is emptied past 64."""
        if len(self._hyper) >= 64:
            self._hyper.clear()
        self._hyper[key] = hyper

    def _error_flag(self) -> Array:
        if self._err is None:
            self._err = self.xp.zeros(1, dtype=self.xp.int32)
        return self._err

    def raise_pending_errors(self) -> None:
        """Raise what an optimizer kernel flagged since the last call (a step counter beyond the bias
        table: impossible while the optimizer's ``t_max`` bounds the counters, so checked lazily, at
        checkpoint time, instead of with a host round trip per step)."""
        if self._err is not None and int(self._err.get()[0]):
            self._err.fill(0)
            raise KernelError("a block's step count exceeded the bias-correction table (corrupt state?)")

    @staticmethod
    def _grid(nnzb: int, bs: int) -> tuple[tuple[int], tuple[int]]:
        per = THREADS // bs if bs <= THREADS else 1
        lanes = bs if bs <= THREADS else THREADS
        return (-(-nnzb // per),), (per * lanes,)

    def sgd(self, p: Array, idx: Array, vals: Array, bs: int, lr: float, wd: float) -> None:
        n, nnzb = int(p.shape[0]), int(idx.shape[0])
        self.check_indices(idx, n_blocks(n, bs))
        if nnzb == 0:
            return
        fn = self._function(OPTIM_SOURCE, "wanrt_sgd", BS=bs)
        grid, block = self._grid(nnzb, bs)
        args = (p, idx, vals, np.int64(nnzb), np.int64(n), np.float32(-lr), np.float32(wd), np.int32(wd != 0))
        fn(grid, block, args)
        self._launched(idx)

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
        n, nnzb = int(p.shape[0]), int(idx.shape[0])
        self.check_indices(idx, n_blocks(n, bs))
        if nnzb == 0:
            return
        fn = self._function(OPTIM_SOURCE, "wanrt_momentum", BS=bs)
        grid, block = self._grid(nnzb, bs)
        f32 = np.float32
        args = (
            p,
            buf,
            steps,
            idx,
            vals,
            np.int64(nnzb),
            np.int64(n),
            f32(-lr),
            f32(mu),
            f32(1.0 - dampening),
            np.int32(bool(nesterov)),
            f32(wd),
            np.int32(wd != 0),
        )
        fn(grid, block, args)
        self._launched(idx)

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
        n, nnzb = int(p.shape[0]), int(idx.shape[0])
        self.check_indices(idx, n_blocks(n, bs))
        if nnzb == 0:
            return
        bc1, bc2 = bias.upto(t_max, self.xp)
        fn = self._function(OPTIM_SOURCE, "wanrt_adam", BS=bs)
        grid, block = self._grid(nnzb, bs)
        key = ("adam", lr, bias.beta1, bias.beta2, wd, eps, bool(decoupled))
        hyper = self._hyper.get(key)
        if hyper is None:  # the hyperparameters' kernel scalars, made once per setting
            f32, beta2 = np.float32, bias.beta2
            hyper = (
                np.float64(lr),
                f32(1.0 - bias.beta1),
                f32(beta2),
                f32(1.0 - beta2),
                f32(wd),
                f32(eps),
                f32(1.0 - lr * wd),
                np.int32(wd != 0),
                np.int32(bool(decoupled)),
            )
            self._remember_hyper(key, hyper)
        args = (p, m, v, steps, idx, vals, np.int64(nnzb), np.int64(n), bc1, bc2, np.int64(bc1.shape[0]))
        fn(grid, block, (*args, *hyper, self._error_flag()))
        self._launched(idx)
