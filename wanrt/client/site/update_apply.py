"""The result path: the leader admits a gateway's result, every rank applies it averaged, sparsely.

StellaTrain §3.1: the sparse optimizer steps only the blocks an update names. A gateway's result is the SUM
of the sites' contributions (each already its site's mean gradient), so every rank divides it by the number
of sites it names before the step; every rank of every site does the same arithmetic on the same bits, so
all keep identical parameters.

On a GPU the averaged update is written straight into a pinned host buffer kept per layer
(:class:`~wanrt.kernels.cupy_staging.PinnedUpdate`), which the optimizer's upload then sends with one DMA:
the averaging is the only host pass over the update's values, where it used to be followed by a second
copy into the staging's pinned memory (issue 26: that copy cost more than the Adam kernel and the PCIe
transfer together).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from wanrt.client.link.api import UpdateArrived
from wanrt.client.site.decision import SiteUpdate
from wanrt.errors import KernelError, RemoteProtocolError
from wanrt.kernels import SparseOptimizer as KernelOptimizer
from wanrt.kernels import kernels_by_name
from wanrt.payload import SparsePayload

__all__ = ["UpdateApplier", "site_update"]


def site_update(ev: UpdateArrived, params: Sequence[torch.Tensor], peer: str) -> SiteUpdate:
    """Leader: a gateway's result as a :class:`SiteUpdate`, once everything it says about its layer fits
    the model (``params``), before it touches parameters; else a :class:`RemoteProtocolError` of ``peer``."""
    if not 0 <= ev.layer < len(params):
        raise RemoteProtocolError(f"update for unknown layer {ev.layer}", peer=peer, layer=ev.layer)
    numel = params[ev.layer].numel()
    if ev.payload.dense_len != numel or ev.payload.layer != ev.layer:
        raise RemoteProtocolError(
            f"update for layer {ev.layer} has {ev.payload.dense_len} elements, the layer has {numel}",
            peer=peer,
            layer=ev.layer,
        )
    if not ev.sites:
        raise RemoteProtocolError("update lists no contributing site", peer=peer, layer=ev.layer)
    # kept in its wire dtype: UpdateApplier.averaged widens it once, straight into the averaging buffer
    return SiteUpdate(ev.iteration, ev.layer, len(ev.sites), ev.payload)


class UpdateApplier:
    """Averages and applies updates to one rank's parameters, with one averaging buffer per layer."""

    def __init__(self, *, pinned_bytes: int = 1 << 30) -> None:
        self._avg_bufs: dict[int, npt.NDArray[np.float32]] = {}  # per-layer averaged updates
        self._pinned: dict[int, Any] = {}  # per-layer pinned buffers for CUDA parameters (None: no CuPy)
        #: host memory the per-layer pinned buffers may take (ClientConfig.pinned_update_bytes)
        self._pinned_budget = pinned_bytes
        self._pinned_used = 0

    def apply(
        self, updates: Sequence[SiteUpdate], params: Sequence[torch.Tensor], optimizer: KernelOptimizer
    ) -> None:
        """Step ``optimizer`` with each update, averaged, on its layer of ``params`` (in order)."""
        with torch.no_grad():
            for u in updates:
                p = u.payload
                param = params[u.layer]
                staged = self._pinned_buffer(u.layer, p) if param.is_cuda else None
                if staged is not None:
                    idx, vals = staged.arrays(p.nnz_blocks, p.nnz)
                    np.copyto(idx, p.indices, casting="same_kind")
                    self.average_into(u, vals)
                else:
                    idx, vals = p.indices, self.averaged(u)
                # the indices are p's (or an exact copy): p's validation (the codec's) holds for them
                avg = SparsePayload(p.layer, p.dense_len, p.block_size, idx, vals, "fp32").carry_validation(p)
                optimizer.step(u.layer, param.data.view(-1), avg)

    def _pinned_buffer(self, layer: int, p: SparsePayload) -> Any:
        """The layer's pinned host buffer, made on first use; None where the CuPy path is unavailable or
        where it would take the pinned total past the budget (that layer's updates then take the ordinary
        way for good, and its buffer is let go)."""
        if layer in self._pinned and self._pinned[layer] is None:
            return None
        buf = self._pinned.get(layer)
        if buf is None:
            try:
                make = getattr(kernels_by_name("cupy"), "pinned_update", None)
            except KernelError:
                make = None
            buf = self._pinned[layer] = make() if make is not None else None
            if buf is None:
                return None
        size = buf.bytes_for(p.nnz_blocks, p.nnz)
        if self._pinned_used - buf.nbytes + size > self._pinned_budget:
            self._pinned_used -= buf.nbytes
            self._pinned[layer] = None
            return None
        self._pinned_used += size - buf.nbytes
        return buf

    def averaged(self, u: SiteUpdate) -> npt.NDArray[np.float32]:
        """The update's values as fp32 divided by its contributing sites, in a buffer kept per layer.

        Why not ``values_f32() * (1 / n)``: that is two fresh layer-sized arrays per update (their page
        faults, and NumPy's fp16 widening at ~1–2 ns per element: 10 ms for a 5 M-element dense update,
        the largest part of a dense step's apply; docs/round_bench.md, "Through the client"). torch widens
        fp16 with vector instructions, exactly (every fp16 is an fp32), and the fp32 product by
        ``float32(1/n)`` is the very product NumPy computed, so the applied values are bit-identical.
        """
        p = u.payload
        n = p.nnz
        if p.value_dtype == "fp32" and u.n_sites == 1:
            return p.values  # one site, fp32: the values as they are (the optimizer only reads them)
        buf = self._avg_bufs.get(u.layer)
        if buf is None or buf.shape[0] < n:
            buf = self._avg_bufs[u.layer] = np.empty(max(n, 1), dtype=np.float32)
        return self.average_into(u, buf[:n])

    @staticmethod
    def average_into(u: SiteUpdate, out: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Write the update's values, widened to fp32 and divided by its sites, into ``out`` (``nnz``
        floats); the same bits whatever ``out`` is (a per-layer buffer or pinned memory)."""
        p = u.payload
        scale = np.float32(1.0 / u.n_sites)
        if p.value_dtype == "fp16":
            if p.values.flags.writeable:
                src = torch.from_numpy(p.values)
            else:  # a received payload is a read-only view of the frame; torch only reads it here
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)
                    src = torch.from_numpy(p.values)
            torch.from_numpy(out).copy_(src)
        else:
            np.copyto(out, p.values_f32())
        if scale != np.float32(1.0):
            torch.from_numpy(out).mul_(float(scale))  # an fp32 tensor times an fp32-exact scalar: fp32
        return out
