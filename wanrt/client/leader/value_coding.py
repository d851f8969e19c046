"""Low-bit values on the leader: quantise each payload after selection, keep the error in a residual.

Why here and not in the link: the quantisation error has to go back into the error-feedback residual
(issue 23, SparseLoCo: 2-bit values converge only with EF), and the residual lives with the compressor.
A sparse payload's error (``selected - dequantised``) is added to the compressor's residual at the
selected positions, which selection had just zeroed; a dense payload (density 1, no EF residual) keeps a
residual of its own here, added to the next dense gradient before it is quantised. Either way the
invariant of error feedback holds: ``sent + residual == input`` up to one fp32 rounding per element
(``tests/wanrt/client/leader/test_value_coding.py``). The payload handed on carries its codes
(``SparsePayload.coded``), so the codec sends exactly the values that were accounted for.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from wanrt.codec.lowbit import quantise_payload
from wanrt.payload import SparsePayload

__all__ = ["ValueCoder"]


class ValueCoder:
    """Quantises payloads to one low-bit coding; holds the dense payloads' residuals."""

    def __init__(self, coding: str, scale_block: int) -> None:
        self.coding = coding
        self.scale_block = scale_block
        self._dense: dict[int, npt.NDArray[np.float32]] = {}  # layer -> residual over the payload's slots

    def reset(self) -> None:
        """Forget the dense residuals (a parameter resync: see ``LayerCompressor.reset_residuals``)."""
        self._dense.clear()

    def sparse(self, p: SparsePayload, residual: Any | None) -> SparsePayload:
        """``p`` quantised; ``p.values - dequantised`` added into ``residual`` (the EF residual of the whole
        layer, NumPy or torch, CPU or CUDA) at ``p``'s positions. Without a residual the error is lost (the
        user turned error feedback off)."""
        q = quantise_payload(p, self.coding, self.scale_block)
        if q is p or residual is None or p.nnz_blocks == 0:
            return q
        diff = SparsePayload(p.layer, p.dense_len, p.block_size, p.indices, p.values_f32() - q.values)
        _add_into(residual, diff)
        return q

    def dense(self, p: SparsePayload) -> SparsePayload:
        """A dense payload (every block, in order) plus this layer's residual, quantised; the new residual is
        what the quantisation left out. ``p``'s values are not modified."""
        r = self._dense.get(p.layer)
        if r is not None and r.shape[0] != p.nnz:
            r = None  # the layer changed length: what it held belongs to another tensor
        acc = p.values_f32() + r if r is not None else np.array(p.values_f32(), dtype=np.float32)
        full = SparsePayload(p.layer, p.dense_len, p.block_size, p.indices, acc, "fp32")
        q = quantise_payload(full, self.coding, self.scale_block)
        if q is full:  # not codable (not finite): sent as it is, nothing held back
            self._dense.pop(p.layer, None)
            return full
        np.subtract(acc, q.values, out=acc)
        self._dense[p.layer] = acc
        return q

    def state_dict(self) -> dict[str, Any]:
        return {"dense": {k: v.copy() for k, v in self._dense.items()}}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        dense = state.get("dense") if isinstance(state, dict) else None
        self._dense = (
            {int(k): np.array(v, dtype=np.float32) for k, v in dense.items()}
            if isinstance(dense, dict)
            else {}
        )


def _add_into(residual: Any, diff: SparsePayload) -> None:
    """``residual += diff`` over ``diff``'s positions, on the residual's own device."""
    if isinstance(residual, np.ndarray):
        diff.add_into(residual)
        return
    mod = type(residual).__module__
    if mod.startswith("torch") and not residual.is_cuda:
        diff.add_into(residual.numpy())
        return
    if mod.startswith("torch"):
        import torch

        bs = diff.block_size
        pos = (diff.indices[:, None] * bs + np.arange(bs)).reshape(-1)
        keep = pos < diff.dense_len
        idx = torch.from_numpy(pos[keep]).to(residual.device)
        residual.index_add_(0, idx, torch.from_numpy(diff.values[keep]).to(residual.device))
        return
    import cupy  # a CuPy residual (ErrorFeedback on a CUDA gradient)

    bs = diff.block_size
    pos = (diff.indices[:, None] * bs + np.arange(bs)).reshape(-1)
    keep = pos < diff.dense_len
    residual[cupy.asarray(pos[keep])] += cupy.asarray(diff.values[keep])  # positions are unique
