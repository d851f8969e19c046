"""Weight prediction for stale updates: the next gradient is taken where the parameters are about to be.

Why (measured, docs/client.md "Loss spikes and weight prediction"): with partial staleness 1 a layer's
update is applied one iteration late, so SGD runs ``θ_{t+1} = θ_t − η·g(θ_{t−1})``. On a direction of
curvature ``h`` that recursion (``z² − z + ηh = 0``) is stable only for ``ηh < 1``, half the ``ηh < 2`` of
synchronous SGD. A workload trained at the edge of synchronous stability (the demo's MLP at lr 0.3 already
shows bumps of 1.5× in its dense arm) then blows up: the demo's sparse arms jumped 0.54 → 1.55 around
iteration 70 in every seed, where the same run at staleness 0 rose at most 1.05×. Error-feedback residual
clipping or decay, adaptive gradient clipping and a smaller lr were measured and did not remove it, or cost
40–80 % more iterations.

The fix is SpecTrain's weight prediction (Chen et al. 2018, "Efficient and Robust Parallel DNN Training
through Model Parallelism on Multi-GPU Platform", §4: compute on the weights the stale update will produce)
with the one estimate of the in-flight update a site has for free: its own contribution. Between two steps
every rank of the site holds ``θ̂ = θ − η·Σ own`` (the site's own payloads pushed and not yet applied), so the
next gradient is taken at about the point the delayed update will move the job to; at the start of the next
step the touched elements are put back bit for bit and the job's real updates are applied to ``θ``, which
stays identical at every site. Where the sites agree (the sharp, consistent directions that destabilise),
``own ≈ aggregate`` and the delay is gone; where they disagree the error is one step of one site's gradient.

Only the elements of the own payloads' blocks are saved and moved (density × layer), so the cost is that
of a sparse SGD step. It applies to SGD, whose step is ``−η·u``; other optimizers' steps depend on their
state and are not predicted (not measured).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from wanrt.payload import SparsePayload

__all__ = ["WeightPrediction"]


def _element_index(payload: SparsePayload, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The flat element positions and fp32 values of a block payload (the last block may be partial)."""
    bs = payload.block_size
    idx = torch.as_tensor(payload.indices, dtype=torch.int64)
    pos = (idx.view(-1, 1) * bs + torch.arange(bs, dtype=torch.int64).view(1, -1)).reshape(-1)
    vals = torch.as_tensor(payload.values_f32(), dtype=torch.float32).reshape(-1)
    keep = pos < payload.dense_len
    if not bool(keep.all()):
        pos, vals = pos[keep], vals[keep]
    return pos.to(device), vals.to(device)


class WeightPrediction:
    """Moves parameters to the predicted point and back; one per rank, driven by the context's step."""

    def __init__(self) -> None:
        # (layer, element positions, the values those positions held before the move), in move order
        self._saved: list[tuple[int, torch.Tensor, torch.Tensor]] = []

    @property
    def active(self) -> bool:
        """Whether parameters are at the predicted point now (not the job's)."""
        return bool(self._saved)

    def predict(self, params: list[torch.Tensor], own: list[SparsePayload], lr: float) -> None:
        """``θ ← θ − lr·payload`` on each in-flight own payload's elements, saving what they held."""
        if self._saved:
            raise RuntimeError("predict() twice without restore()")  # a bug in the caller, not user input
        with torch.no_grad():
            for payload in own:
                if payload.nnz_blocks == 0:
                    continue
                flat = params[payload.layer].data.view(-1)
                pos, vals = _element_index(payload, flat.device)
                self._saved.append((payload.layer, pos, flat[pos].clone()))
                flat.index_add_(0, pos, vals.to(flat.dtype), alpha=-lr)

    @contextlib.contextmanager
    def suspended(self, params: list[torch.Tensor]) -> Iterator[None]:
        """Within the block the parameters are the job's (every moved element back, bit for bit); after
        it, the predicted point again, bit for bit. Why: the job's model is ``θ``, identical at every site;
        ``θ̂`` is one site's guess of where the in-flight update takes it, off by one step of one site's
        payload. A loss evaluated at ``θ̂`` between steps (the demo's curve) measured that guess, not the
        model: single bumps of 1.2-1.4× the best loss so far, in the fixed arm (docs/client.md)."""
        moved: list[tuple[int, torch.Tensor, torch.Tensor]] = []
        with torch.no_grad():
            for layer, pos, old in reversed(self._saved):
                flat = params[layer].data.view(-1)
                moved.append((layer, pos, flat[pos].clone()))
                flat[pos] = old
        try:
            yield
        finally:
            with torch.no_grad():
                for layer, pos, cur in reversed(moved):
                    params[layer].data.view(-1)[pos] = cur

    def restore(self, params: list[torch.Tensor]) -> None:
        """Put every moved element back exactly (last move first, so overlapping payloads unwind)."""
        with torch.no_grad():
            while self._saved:
                layer, pos, old = self._saved.pop()
                params[layer].data.view(-1)[pos] = old
