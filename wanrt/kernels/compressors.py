"""Gradient compressors: one layer's dense fp32 gradient in, a COO :class:`~wanrt.payload.SparsePayload` out.

* ``threshold_v_block`` — StellaTrain's cache-aware threshold-v (§3.2): whole 16-float blocks (one 64-byte
  cache line) are selected when the sum of ``|g|`` over the block reaches ``v``; ``v`` is kept per layer and
  moved by AIMD (:mod:`wanrt.kernels.aimd`). Selecting whole cache lines makes both the selection pass and
  the optimizer's scatter touch every fetched line fully (the paper's 3.35× on compression and 7.6× on the
  sparse update over element-wise selection).
* ``threshold_v`` — the vanilla, element-wise threshold-v (block size 1) the paper compares against.
* ``topk`` — exact top-k (of elements, or of block sums when ``block_size > 1``), by ``argpartition``.
* ``randomk`` — k blocks uniformly at random, seeded per layer: the cheap baseline of Fig. 13b. Values are
  sent unscaled (with error feedback the rest is sent later, so no ``n/k`` rescaling is needed).

Threshold-v never yields an empty payload for a nonzero gradient and never more than ``cap`` blocks; a NaN or
infinite gradient is a :class:`~wanrt.errors.KernelError` (sending it would poison every site).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from wanrt.config import check
from wanrt.errors import ConfigError, KernelError
from wanrt.kernels import aimd
from wanrt.kernels.arrays import Array, as_vector, is_cupy_array
from wanrt.kernels.backend import get_kernels
from wanrt.kernels.config import MAX_BLOCK_SIZE, CompressorConfig
from wanrt.kernels.reference import ReferenceKernels
from wanrt.payload import SparsePayload

__all__ = [
    "COMPRESSOR_KINDS",
    "Compressor",
    "CompressorKind",
    "RandomK",
    "ThresholdV",
    "TopK",
    "make_compressor",
]

CompressorKind = Literal["threshold_v_block", "threshold_v", "topk", "randomk"]
COMPRESSOR_KINDS: tuple[str, ...] = ("threshold_v_block", "threshold_v", "topk", "randomk")


def _host(a: Array) -> Any:
    return a.get() if is_cupy_array(a) else a


def _check_layer(layer: int) -> None:
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or layer < 0:
        raise KernelError("layer must be a non-negative integer", value=layer)


def _top_blocks(k: ReferenceKernels, sums: Array, count: int) -> Array:
    """Indices (ascending) of the ``count`` largest *positive* sums; raises on NaN/inf among them."""
    return _top_blocks_and_sums(k, sums, count)[0]


def _top_blocks_and_sums(k: ReferenceKernels, sums: Array, count: int) -> tuple[Array, Array]:
    """:func:`_top_blocks`, and the ``min(count, n)`` largest sums themselves (any order, zeros kept)."""
    xp = k.xp
    nb = int(sums.shape[0])
    count = min(count, nb)
    if count <= 0:
        return xp.zeros(0, dtype=xp.int64), xp.zeros(0, dtype=xp.float32)
    idx = k.top_indices(sums, count)
    chosen = sums[idx]
    if not bool(xp.isfinite(chosen).all()):  # NaN and inf sort last, so they are always among the chosen
        raise KernelError("gradient contains NaN or infinite values")
    return xp.sort(idx[chosen > 0]).astype(xp.int64, copy=False), chosen


def _kth_largest(k: ReferenceKernels, sums: Array, rank: int) -> float:
    """The ``rank``-th largest value (1-based) of ``sums``."""
    n = int(sums.shape[0])
    return float(k.partition(sums, [n - rank])[n - rank])


class Compressor(ABC):
    """Per-layer compressor; keeps whatever state its selection rule needs between steps of a layer."""

    kind: str
    #: True where the selection itself refuses a non-finite block: a block's sum of ``|g|`` is finite only
    #: if every element is (NaN and inf propagate into it), and threshold-v's pass and the exact top-k
    #: both raise on a non-finite sum among the chosen. The values need no second check then, which on a
    #: GPU is a reduction and a device-to-host read per layer (issue 26). Random-k looks at no sums.
    sums_vouch_for_values: bool = False

    def __init__(self, density: float, block_size: int, config: CompressorConfig) -> None:
        self.density = density
        self.block_size = block_size
        self.config = config
        self._targets_memo: tuple[tuple[Any, ...], aimd.SelectionTargets] | None = None

    def targets(self, dense_len: int) -> aimd.SelectionTargets:
        """How many blocks a layer of ``dense_len`` elements sends (``k_block``) and the derived limits
        (kept for the last (length, density): a GPU selection's host time is counted in microseconds)."""
        key = (dense_len, self.block_size, self.density, id(self.config))
        memo = self._targets_memo
        if memo is not None and memo[0] == key:
            return memo[1]
        t = aimd.targets(dense_len, self.block_size, self.density, self.config)
        self._targets_memo = (key, t)  # (the config is held by self: its id is not reused meanwhile)
        return t

    def compress(self, layer: int, grad: object) -> SparsePayload:
        """Select blocks of ``grad`` (1-D fp32, NumPy/CuPy/torch; not modified) into a payload."""
        _check_layer(layer)
        x = as_vector(grad, "grad")
        k = get_kernels(x)
        idx = self._select(layer, x, k, None)
        return self._payload(layer, x, k, idx)

    def compress_with_feedback(self, layer: int, grad: object, residual: Array) -> SparsePayload:
        """Error feedback step: ``residual += grad``; send the selection of it; zero what was sent.

        ``residual`` must be a 1-D fp32 array of the gradient's length on the same device; afterwards it
        holds exactly what was left out (``sent + residual == old residual + grad`` elementwise).
        """
        idx, vals = self.select_device(layer, grad, residual)
        return self._host_payload(layer, int(as_vector(grad, "grad").shape[0]), idx, vals)

    def select_device(self, layer: int, grad: object, residual: Array | None = None) -> tuple[Array, Array]:
        """The selection as arrays on the gradient's device: sorted block indices (int64) and their values
        (fp32, ``block_size`` per index). With ``residual``: the error-feedback step of
        :meth:`compress_with_feedback` (``residual += grad``, select, zero what was selected).

        Why apart from :meth:`compress`: on a GPU the caller decides how the selection reaches the host
        (the client's leader copies it into pinned buffers on a side stream, docs/client.md "On a GPU"),
        so only the selected 1 % ever crosses PCIe.
        """
        _check_layer(layer)
        g = as_vector(grad, "grad")
        if residual is None:
            k = get_kernels(g)
            idx = self._select(layer, g, k, None)
            return idx, self._values(layer, g, k, idx)
        r = as_vector(residual, "residual", writable=True)
        if r.shape != g.shape or is_cupy_array(r) != is_cupy_array(g):
            raise KernelError("residual and gradient differ in length or device", value=tuple(r.shape))
        k = get_kernels(r)
        idx = self._select(layer, r, k, g)
        vals = self._values(layer, r, k, idx)
        k.zero_blocks(r, idx, self.block_size)
        return idx, vals

    def _values(self, layer: int, x: Array, k: ReferenceKernels, idx: Array) -> Array:
        vals = k.gather(x, idx, self.block_size)
        if self.sums_vouch_for_values:
            return vals
        if not bool(k.xp.isfinite(vals).all()):
            raise KernelError(f"gradient of layer {layer} contains NaN or infinite values", layer=layer)
        return vals

    def _host_payload(self, layer: int, dense_len: int, idx: Array, vals: Array) -> SparsePayload:
        indices = np.ascontiguousarray(_host(idx), dtype=np.int64)
        values = np.ascontiguousarray(_host(vals), dtype=np.float32)
        return SparsePayload(layer, dense_len, self.block_size, indices, values, "fp32")

    def _payload(self, layer: int, x: Array, k: ReferenceKernels, idx: Array) -> SparsePayload:
        return self._host_payload(layer, int(x.shape[0]), idx, self._values(layer, x, k, idx))

    @abstractmethod
    def _select(self, layer: int, x: Array, k: ReferenceKernels, add: Array | None) -> Array:
        """Sorted unique block indices to send; with ``add``, first ``x += add`` (x is then a residual)."""

    def state_dict(self) -> dict[str, Any]:
        """Per-layer selection state, plain Python values (for a trainer checkpoint)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""
        del state

    def reset(self, layer: int | None = None) -> None:
        """Forget the state of one layer (or all): the next step starts from scratch."""
        del layer


@dataclass
class _LayerSel:
    """A layer's threshold state plus its preallocated candidate buffers."""

    dense_len: int
    state: aimd.ThresholdState | None
    idx_buf: Array
    sum_buf: Array
    exact_steps: int = 0
    #: the blocks sampled for a threshold read off a sample (:meth:`ThresholdV._sampled_v`), made once
    sample: Array | None = None
    #: the last step's threshold missed (a second pass ran): this step's comes from the sample
    reaim: bool = False


class ThresholdV(Compressor):
    """Threshold-v on blocks of ``block_size`` (16: cache-aware, §3.2; 1: vanilla element-wise)."""

    sums_vouch_for_values = True

    def __init__(self, density: float, block_size: int, config: CompressorConfig) -> None:
        super().__init__(density, block_size, config)
        self.kind = "threshold_v_block" if block_size > 1 else "threshold_v"
        self._layers: dict[int, _LayerSel] = {}

    def threshold(self, layer: int) -> float | None:
        """Current ``v`` of a layer (None before its first step)."""
        sel = self._layers.get(layer)
        return None if sel is None or sel.state is None else sel.state.v

    def exact_steps(self, layer: int) -> int:
        """How many steps of this layer needed the exact second pass (the AIMD safety net)."""
        sel = self._layers.get(layer)
        return 0 if sel is None else sel.exact_steps

    def _layer(self, layer: int, x: Array, k: ReferenceKernels, t: aimd.SelectionTargets) -> _LayerSel:
        n = int(x.shape[0])
        sel = self._layers.get(layer)
        xp = k.xp
        if sel is None or sel.dense_len != n:
            sel = _LayerSel(n, None, xp.empty(t.buffer, dtype=xp.int64), xp.empty(t.buffer, dtype=xp.float32))
            self._layers[layer] = sel
        elif int(sel.idx_buf.shape[0]) != t.buffer or is_cupy_array(sel.idx_buf) != is_cupy_array(x):
            # the density changed (a scheduler decision), or the state was loaded on the host and the layer
            # lives on the device: the buffers follow, the threshold state stays
            # the density changed (a scheduler decision): the buffers follow it, the threshold state stays
            sel.idx_buf = xp.empty(t.buffer, dtype=xp.int64)
            sel.sum_buf = xp.empty(t.buffer, dtype=xp.float32)
            sel.sample = None  # made again on the layer's device
        return sel

    def _sampled_v(
        self,
        layer: int,
        sel: _LayerSel,
        x: Array,
        add: Array | None,
        k: ReferenceKernels,
        t: aimd.SelectionTargets,
        want: int,
    ) -> float | None:
        """The threshold ``want`` blocks of ``x`` (+ ``add``) would pass, read off the sums of a fixed
        random sample of blocks (``sample_blocks`` of them, :func:`aimd.initial_threshold`), or None when
        the target is too rare for the sample to see or a sampled sum is not finite."""
        nb = t.n_blocks
        if sel.sample is None:
            rng = np.random.default_rng([self.config.seed, layer])
            size = min(nb, self.config.sample_blocks)
            pick = np.sort(rng.choice(nb, size=size, replace=False)).astype(np.int64)
            sel.sample = k.xp.asarray(pick)
        picked = k.gather(x, sel.sample, self.block_size)
        if add is not None:
            picked = picked + k.gather(add, sel.sample, self.block_size)
        sample = k.block_sums(picked, self.block_size)
        desc = np.sort(np.asarray(_host(sample), dtype=np.float32))[::-1]
        if not np.isfinite(desc).all():
            return None  # the exact step reports the non-finite gradient
        return aimd.initial_threshold(desc, nb, min(want, nb), self.config)

    def _reaim_count(self, t: aimd.SelectionTargets) -> int:
        """How many blocks a threshold aimed by the sample should pass: the middle of ``[aim, buffer]`` in
        log terms, ``sqrt(buffer_factor) * aim`` (see :meth:`_second`)."""
        return math.ceil(math.sqrt(self.config.buffer_factor) * t.aim)

    def _second(
        self, layer: int, sel: _LayerSel, x: Array, k: ReferenceKernels, t: aimd.SelectionTargets
    ) -> Array:
        """The threshold missed (too few passed, or more than the buffer holds): the exact selection, found
        by a second threshold pass aimed by the sample at the middle of ``[aim, buffer]`` (in log terms:
        ``sqrt(buffer_factor) * aim``) where that lands there — then every block above the ``aim``-th and
        ``cap``-th largest sum is a candidate, so the candidates' top ``cap`` and ``aim``-th sum are the
        exact ones, and the controller is re-anchored as :meth:`_exact` would — else :meth:`_exact`.

        Why: with error feedback the residual's sums grow for the first steps faster than the controller
        follows, and :meth:`_exact`'s partition of every block sum cost ~1.3 ms per step on 5 M floats for
        the first ~9 steps (docs/round_bench.md, "Session 13"); a threshold pass without the add reads the
        residual once (~0.3 ms). ``x`` already holds the residual plus the gradient."""
        sel.reaim = True
        want = self._reaim_count(t)
        v2 = self._sampled_v(layer, sel, x, None, k, t, want)
        st = sel.state
        if v2 is not None and v2 > aimd.FLT_MIN and st is not None:
            r = k.select_stats(
                x, v2, self.block_size, sel.idx_buf, sel.sum_buf, None, t.aim, t.cap, self.config.probe_ratio
            )
            if r.nonfinite:
                raise KernelError(f"gradient of layer {layer} contains NaN or infinite values", layer=layer)
            if max(t.aim, t.cap) <= r.passed <= t.buffer and r.aim_v is not None:
                sel.exact_steps += 1
                aimd.update(st, t.aim, r.aim_v, r.probe, t, self.config)
                return r.ids
        return self._exact(sel, x, k, t)

    def _exact(self, sel: _LayerSel, x: Array, k: ReferenceKernels, t: aimd.SelectionTargets) -> Array:
        """Second pass: every block sum, exact top-``cap``; re-anchors v exactly."""
        sel.exact_steps += 1
        sums = k.block_sums(x, self.block_size)
        idx, top = _top_blocks_and_sums(k, sums, t.cap)
        # the aim-th largest of all sums is the aim-th largest of the cap largest when aim <= cap: read it
        # off those (a partition of cap values, not of every block: on a GPU a sort of the whole layer)
        aim_v = _kth_largest(k, top if t.aim <= int(top.shape[0]) else sums, t.aim)
        probe = int((sums >= k.xp.float32(aim_v * self.config.probe_ratio)).sum()) if aim_v > 0 else 0
        if sel.state is None:
            sel.state = aimd.ThresholdState(v=aim_v if aim_v > 0 else aimd.FLT_MIN)
        aimd.update(sel.state, t.aim, aim_v, probe, t, self.config)
        return idx

    def _select(self, layer: int, x: Array, k: ReferenceKernels, add: Array | None) -> Array:
        xp = k.xp
        n = int(x.shape[0])
        if n == 0:
            return xp.zeros(0, dtype=xp.int64)
        t = self.targets(n)
        sel = self._layer(layer, x, k, t)
        if t.dense:
            if add is not None:
                x += add
            return _top_blocks(k, k.block_sums(x, self.block_size), t.n_blocks)
        if sel.state is None:
            v0 = self._sampled_v(layer, sel, x, add, k, t, t.aim)
            if v0 is None:
                if add is not None:
                    x += add
                return self._exact(sel, x, k, t)
            sel.state = aimd.ThresholdState(v=v0)
        st = sel.state
        predicted = st.v
        if sel.reaim:  # the last step missed: aim this one by the sample too (the controller re-learns)
            want = self._reaim_count(t)
            v = self._sampled_v(layer, sel, x, add, k, t, want)
            if v is not None and v > aimd.FLT_MIN:
                st.v = v
        # one pass, the controller's numbers and the payload's blocks (kernels.select_stats)
        r = k.select_stats(
            x, st.v, self.block_size, sel.idx_buf, sel.sum_buf, add, t.aim, t.cap, self.config.probe_ratio
        )
        if r.nonfinite:
            raise KernelError(f"gradient of layer {layer} contains NaN or infinite values", layer=layer)
        if r.passed < t.floor or r.passed > t.buffer:  # too few to send the density, or past the buffer
            return self._second(layer, sel, x, k, t)
        # back to the controller once its own threshold would have passed at least ``aim`` blocks here
        # (with error feedback it overshoots the growing sums for the first steps, and a threshold above
        # the residual's cliff passes almost nothing; one below passes more, trimmed to the cap)
        sel.reaim = sel.reaim and (r.aim_v is None or predicted > r.aim_v)
        aimd.update(st, r.passed, r.aim_v, r.probe, t, self.config)
        return r.ids

    def state_dict(self) -> dict[str, Any]:
        return {
            "layers": {
                layer: {"dense_len": sel.dense_len, **sel.state.as_dict()}
                for layer, sel in self._layers.items()
                if sel.state is not None
            }
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        layers = state.get("layers")
        if not isinstance(layers, dict):
            raise KernelError("compressor state must have a 'layers' table")
        restored: dict[int, _LayerSel] = {}
        for layer, d in layers.items():
            try:
                st = aimd.ThresholdState.from_dict(d)
                n = int(d["dense_len"])
            except (KeyError, TypeError, ValueError) as exc:
                raise KernelError(f"bad compressor state for layer {layer}: {exc}") from None
            if not (aimd.FLT_MIN <= st.v <= aimd.FLT_MAX) or n < 0:
                raise KernelError(f"bad compressor state for layer {layer}", value=st.v)
            b = self.targets(n).buffer
            restored[int(layer)] = _LayerSel(
                n, st, np.empty(b, dtype=np.int64), np.empty(b, dtype=np.float32)
            )
        self._layers = restored

    def reset(self, layer: int | None = None) -> None:
        if layer is None:
            self._layers.clear()
        else:
            self._layers.pop(layer, None)


class TopK(Compressor):
    """Exact top-k blocks by block sum (elements when ``block_size == 1``): the accuracy baseline."""

    kind = "topk"
    sums_vouch_for_values = True

    def _select(self, layer: int, x: Array, k: ReferenceKernels, add: Array | None) -> Array:
        if add is not None:
            x += add
        if int(x.shape[0]) == 0:
            return k.xp.zeros(0, dtype=k.xp.int64)
        return _top_blocks(k, k.block_sums(x, self.block_size), self.targets(int(x.shape[0])).cap)


class RandomK(Compressor):
    """k blocks uniformly at random without replacement; per-layer seeded, reproducible streams."""

    kind = "randomk"

    def __init__(self, density: float, block_size: int, config: CompressorConfig) -> None:
        super().__init__(density, block_size, config)
        self._rngs: dict[int, np.random.Generator] = {}

    def _select(self, layer: int, x: Array, k: ReferenceKernels, add: Array | None) -> Array:
        if add is not None:
            x += add
        n = int(x.shape[0])
        if n == 0:
            return k.xp.zeros(0, dtype=k.xp.int64)
        rng = self._rngs.setdefault(layer, np.random.default_rng([self.config.seed, layer]))
        t = self.targets(n)
        pick: npt.NDArray[np.int64] = np.sort(rng.choice(t.n_blocks, size=t.cap, replace=False))
        return k.xp.asarray(pick.astype(np.int64))

    def reset(self, layer: int | None = None) -> None:
        if layer is None:
            self._rngs.clear()
        else:
            self._rngs.pop(layer, None)


def make_compressor(
    kind: CompressorKind | str,
    *,
    density: float,
    block_size: int | None = None,
    config: CompressorConfig | None = None,
) -> Compressor:
    """Build a compressor; ``block_size`` None: the natural one (16 for threshold_v_block, else 1).

    ``threshold_v`` is element-wise by definition; asking it for blocks is a :class:`ConfigError` (use
    ``threshold_v_block``).
    """
    if kind not in COMPRESSOR_KINDS:
        raise ConfigError(
            f"unknown compressor {kind!r}; use one of {', '.join(COMPRESSOR_KINDS)}", key="kind"
        )
    check(
        isinstance(density, (int, float)) and 0.0 < density <= 1.0 and math.isfinite(density),
        "density",
        density,
        "must be in (0, 1]",
    )
    bs = block_size if block_size is not None else (16 if kind == "threshold_v_block" else 1)
    check(
        isinstance(bs, int) and 1 <= bs <= MAX_BLOCK_SIZE,
        "block_size",
        bs,
        f"must be an integer in [1, {MAX_BLOCK_SIZE}]",
    )
    check(
        kind != "threshold_v" or bs == 1,
        "block_size",
        bs,
        "threshold_v is element-wise (block_size 1); use threshold_v_block for blocks",
    )
    cfg = config if config is not None else CompressorConfig()
    if kind in ("threshold_v_block", "threshold_v"):
        return ThresholdV(float(density), bs, cfg)
    if kind == "topk":
        return TopK(float(density), bs, cfg)
    return RandomK(float(density), bs, cfg)
