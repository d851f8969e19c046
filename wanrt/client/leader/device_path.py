"""The site leader's GPU-resident gradient path: residual, selection and staging on the gradient's device.

Why: with CUDA parameters the leader used to copy every layer's whole gradient to pageable host memory
(63 ms for 25 M fp32 on an H200 host, issue 26) and compress it on the CPU: on a GPU cluster the runtime,
not the WAN, was the bottleneck. Here, per layer, on the gradient's device (StellaTrain §3.2–3.3):

1. a **side stream** waits for the layer's in-site reduce (NCCL) and for the event the backward hook
   recorded when the gradient was final, and nothing else: the rest of backward runs on while this layer is
   selected (no device-wide synchronize anywhere);
2. the gradient is scaled to the site's weighted mean (only when the scale is not exactly 1), added to the
   layer's **error-feedback residual, kept on the device**, and selected by the same compressor the CPU
   path uses (:meth:`~wanrt.kernels.Compressor.select_device`, the CuPy kernels through DLPack: no copy);
3. only the **selected indices and values** cross to the host, with asynchronous copies into pinned
   buffers from torch's caching host allocator (reused once the payload that holds them is freed), and the
   worker waits for that one copy's event before handing the payload to the codec and link, unchanged.

The same code runs on CPU tensors (the tests, and a trainer whose parameters live on the host never comes
here: ``Context`` keeps the host path for them): then there is no stream and no copy, the compressor runs
its host kernels on NumPy views, and the payload is what :class:`LayerCompressor` would give, bit for bit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from wanrt.client.config import ClientConfig
from wanrt.client.leader.compression import LayerCompressor
from wanrt.payload import SparsePayload, n_blocks

__all__ = ["DeviceLayerCompressor", "StagingStats"]


class StagingStats:
    """What crossed from the device to the host, per layer and in total (``tools/bench_gpu.py`` reads it
    as ``gpu_d2h_bytes_ratio``): the staged bytes against the bytes of the dense gradients compressed."""

    __slots__ = ("d2h_bytes", "dense_bytes", "layers")

    def __init__(self) -> None:
        self.d2h_bytes = 0
        self.dense_bytes = 0
        self.layers = 0

    def add(self, staged: int, dense: int) -> None:
        self.d2h_bytes += staged
        self.dense_bytes += dense
        self.layers += 1

    @property
    def ratio(self) -> float | None:
        return None if self.dense_bytes == 0 else self.d2h_bytes / self.dense_bytes


class DeviceLayerCompressor(LayerCompressor):
    """:class:`LayerCompressor` plus :meth:`compress_tensor` for gradients that stay on their device."""

    def __init__(self, config: ClientConfig) -> None:
        super().__init__(config)
        self._residuals: dict[int, torch.Tensor] = {}
        self._scaled: dict[int, torch.Tensor] = {}
        self._ready: dict[int, Any] = {}  # layer -> torch.cuda.Event recorded when its gradient was final
        self._streams: dict[torch.device, Any] = {}
        self.stats = StagingStats()

    # -- called on the backward thread --------------------------------------------------------------------

    def mark_ready(self, layer: int, grad: torch.Tensor) -> None:
        """Record, on the stream that produced ``grad``, that it is final (the backward hook's moment), so
        the side stream waits for exactly this point and not for whatever backward queues after it."""
        if grad.is_cuda:
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(grad.device))
            self._ready[layer] = ev

    # -- called on the leader's worker thread -------------------------------------------------------------

    def reset_residuals(self) -> None:
        super().reset_residuals()
        self._residuals.clear()

    def compress_tensor(self, layer: int, grad: torch.Tensor, work: Any, scale: float) -> SparsePayload:
        """``grad`` (the site's summed gradient of ``layer``, any shape, fp32) → payload, on its device.

        ``work``: the pending in-site reduce (or None); ``scale``: the factor to the site's weighted mean
        (applied as one fp32 multiply, as the host path does; skipped when exactly 1).
        """
        flat = grad.detach().reshape(-1)
        with self._on_side_stream(layer, flat, work):
            if flat.dtype != torch.float32:  # after the waits: the gradient is final only then
                flat = flat.float()
            if scale != 1.0:
                buf = self._scaled.get(layer)
                if buf is None or buf.shape != flat.shape or buf.device != flat.device:
                    buf = self._scaled[layer] = torch.empty_like(flat)
                torch.mul(flat, float(np.float32(scale)), out=buf)
                flat = buf
            idx, vals = self._select(layer, flat)
            payload, staged = self._stage(layer, flat, idx, vals)
            # low-bit values: the error goes back into the residual on this (side) stream
            payload = self.code_values(payload, self._residuals.get(layer) if self._ef is not None else None)
        self.stats.add(staged, flat.numel() * 4)
        return payload

    @contextlib.contextmanager
    def _on_side_stream(self, layer: int, flat: torch.Tensor, work: Any) -> Iterator[None]:
        """CUDA: run the block on this device's side stream (torch's and CuPy's current stream both), after
        the reduce and the hook's event; CPU: wait for the reduce, run the block as it is."""
        ready = self._ready.pop(layer, None)
        if not flat.is_cuda:
            if work is not None:
                work.wait()
            yield
            return
        stream = self._streams.get(flat.device)
        if stream is None:
            stream = self._streams[flat.device] = torch.cuda.Stream(flat.device)
        # the worker thread's current device is not the trainer's (torch.cuda.set_device is per thread)
        with torch.cuda.device(flat.device), torch.cuda.stream(stream), _cupy_stream(stream):
            if work is not None:
                work.wait()  # NCCL: makes the current (side) stream wait for the reduce, host not blocked
            if ready is not None:
                stream.wait_event(ready)
            else:  # no hook event (a caller outside the client): everything queued so far
                stream.wait_stream(torch.cuda.default_stream(flat.device))
            flat.record_stream(stream)  # the caching allocator must not reuse it while the side stream reads
            yield

    def _select(self, layer: int, flat: torch.Tensor) -> tuple[Any, Any]:
        """Sorted block indices and their values, as arrays on ``flat``'s device (CuPy on CUDA, NumPy on
        CPU: views through DLPack / ``.numpy()``, no copies)."""
        if self._compressor is None:  # the dense baseline: every block, the (padded) gradient as values
            return None, None
        if self._ef is None:
            return self._compressor.select_device(layer, flat)
        r = self._residuals.get(layer)
        if r is None or r.shape != flat.shape or r.device != flat.device:
            r = self._residuals[layer] = torch.zeros_like(flat)
        return self._compressor.select_device(layer, flat, r)

    def _stage(self, layer: int, flat: torch.Tensor, idx: Any, vals: Any) -> tuple[SparsePayload, int]:
        """The payload on the host: for CUDA, async copies into pinned buffers on the side stream, then a
        wait for that stream's copies only. Returns the payload and the bytes that crossed."""
        n, bs = flat.numel(), self._block_size
        if idx is None:
            blocks = np.arange(n_blocks(n, bs), dtype=np.int64)
            if not flat.is_cuda:
                return SparsePayload.from_dense_blocks(layer, flat.numpy(), blocks, bs), 0
            host = _to_host(flat)
            _wait_side_stream()
            return SparsePayload.from_dense_blocks(layer, host.numpy(), blocks, bs), n * 4
        if not flat.is_cuda:
            return self._compressor_payload(layer, n, np.asarray(idx), np.asarray(vals)), 0
        ti, tv = torch.from_dlpack(idx), torch.from_dlpack(vals)
        hi, hv = _to_host(ti), _to_host(tv)
        _wait_side_stream()
        staged = hi.numel() * 8 + hv.numel() * 4
        return self._compressor_payload(layer, n, hi.numpy(), hv.numpy()), staged

    def _compressor_payload(self, layer: int, n: int, idx: np.ndarray, vals: np.ndarray) -> SparsePayload:
        return SparsePayload(
            layer,
            n,
            self._block_size,
            np.ascontiguousarray(idx, dtype=np.int64),
            np.ascontiguousarray(vals, dtype=np.float32),
            "fp32",
        )


def _to_host(t: torch.Tensor) -> torch.Tensor:
    """A pinned host copy of ``t``, queued on the current (side) stream. Torch's caching host allocator
    hands the block back for reuse once the tensor (hence the payload holding its NumPy view) is freed and
    the copy recorded on it has completed."""
    out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    out.copy_(t, non_blocking=True)
    return out


def _wait_side_stream() -> None:
    """The host waits for the current (side) stream's work so far: this layer's copies, nothing else."""
    done = torch.cuda.Event()
    done.record(torch.cuda.current_stream())
    done.synchronize()


@contextlib.contextmanager
def _cupy_stream(stream: Any) -> Iterator[None]:
    """Make CuPy queue on torch's ``stream`` too (when CuPy is installed; without it, the compressor's
    CUDA path is unavailable and says so)."""
    try:
        import cupy
    except ImportError:
        yield
        return
    index = stream.device.index
    with cupy.cuda.Device(index), cupy.cuda.ExternalStream(stream.cuda_stream, index):
        yield
