"""Error feedback: what compression leaves out of a layer's gradient is kept and added to the next one.

Without it a sparsifying compressor silently drops ~99 % of every gradient; with it nothing is lost, only
delayed (the invariant ``sum of everything sent + residual == sum of all gradients`` holds up to fp32
rounding, and is what the property tests check). StellaTrain relies on this for top-k/threshold-v to
converge (§3.2, following the sparsification literature it cites). The residual lives next to the
gradient (same device) and is updated in the compressor's own pass over memory where the path allows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from wanrt.errors import KernelError
from wanrt.kernels.arrays import Array, aligned_zeros, as_vector, is_cupy_array
from wanrt.kernels.compressors import Compressor
from wanrt.payload import SparsePayload

__all__ = ["ErrorFeedback"]


class ErrorFeedback:
    """Per-layer residuals; ``compress`` = add the residual, compress, keep what was not sent."""

    def __init__(self) -> None:
        self._residual: dict[int, Array] = {}

    def compress(self, layer: int, grad: object, compressor: Compressor) -> SparsePayload:
        """Compress ``grad + residual[layer]`` with ``compressor``; the residual keeps the rest."""
        g = as_vector(grad, "grad")
        on_device = is_cupy_array(g)
        r = self._residual.get(layer)
        if r is not None and on_device and not is_cupy_array(r):
            import cupy  # a residual restored from a checkpoint moves to the gradient's device once

            r = self._residual[layer] = cupy.asarray(r)
        if r is not None and (r.shape != g.shape or is_cupy_array(r) != on_device):
            raise KernelError(
                f"layer {layer} changed length or device since its last gradient; call reset({layer})",
                layer=layer,
                value=tuple(g.shape),
            )
        if r is None:
            if on_device:
                import cupy

                r = cupy.zeros_like(g)
            else:
                r = aligned_zeros(np, int(g.shape[0]), np.float32)
            self._residual[layer] = r
        return compressor.compress_with_feedback(layer, g, r)

    def residual(self, layer: int) -> Array | None:
        """The residual of a layer (a live view: do not modify), or None before its first step."""
        return self._residual.get(layer)

    def reset(self, layer: int | None = None) -> None:
        """Drop the residual of one layer, or of all (e.g. after loading a checkpoint without them)."""
        if layer is None:
            self._residual.clear()
        else:
            self._residual.pop(layer, None)

    def state_dict(self) -> dict[str, Any]:
        """Host copies of every residual, for a trainer checkpoint."""
        return {
            "residuals": {
                k: np.array(v.get() if is_cupy_array(v) else v, dtype=np.float32, copy=True)
                for k, v in self._residual.items()
            }
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (host arrays; moved to the device on first use if needed)."""
        res = state.get("residuals")
        if not isinstance(res, dict):
            raise KernelError("error-feedback state must have a 'residuals' table")
        out: dict[int, Array] = {}
        for k, v in res.items():
            arr = np.asarray(v)
            if arr.ndim != 1 or arr.dtype != np.float32:
                raise KernelError(f"residual of layer {k} must be a 1-D float32 array", layer=k)
            out[int(k)] = aligned_zeros(np, arr.shape[0], np.float32)
            out[int(k)][:] = arr
        self._residual = out
