"""The site leader's push path: a layer's site-summed gradient → the site's weighted mean → payload → gateway.

Runs on the leader's worker thread (:mod:`wanrt.client.leader.worker`), one layer at a time as its reduce
completes, so compression overlaps the rest of the backward pass. On a GPU the residual and the selection
stay on the device (:mod:`wanrt.client.leader.device_path`, docs/client.md "On a GPU"); on the host the
gradient is scaled into a buffer kept per layer and compressed with error feedback
(:mod:`wanrt.client.leader.compression`). While a parameter snapshot is pending the push is empty (zero
blocks) and the residual is not fed: the gradient was computed at parameters known to differ from the job's
(docs/kill_restart.md). Each payload pushed is kept until its job update is applied (weight prediction,
:mod:`wanrt.client.site.prediction`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from wanrt.client.leader.device_path import DeviceLayerCompressor
from wanrt.client.link.api import Link
from wanrt.client.site.settings_in_force import SettingsInForce
from wanrt.payload import SparsePayload

__all__ = ["LeaderPush"]


class LeaderPush:
    """Compresses and pushes the site's layers; ``discarding()`` says whether this iteration's pushes are
    empty (changed only between steps, after the pipeline drained, so every layer of one iteration is pushed
    alike)."""

    def __init__(
        self,
        settings: SettingsInForce,
        world_size: int,
        compressor: DeviceLayerCompressor | None,
        link: Link | None,
        discarding: Callable[[], bool],
        silent: Callable[[int], bool] = lambda layer: False,
        outer_loop: bool = False,
    ) -> None:
        self._settings = settings
        self._world_size = world_size
        self._compressor = compressor
        self._link = link
        self._discarding = discarding
        self._silent = silent  # an outer loop's layers not synchronised this iteration: empty, residual kept
        self._outer_loop = outer_loop  # its .grad is a pseudo-gradient, never a sum of micro-steps
        self._scaled: dict[int, npt.NDArray[np.float32]] = {}  # per-layer scaled gradients
        #: the site's own payloads by (iteration, layer) until their job update is applied
        self.own: dict[tuple[int, int], SparsePayload] = {}

    def compress_and_push(self, iteration: int, layer: int, work: Any, grad: torch.Tensor) -> None:
        """Leader worker thread: the site-averaged gradient of one layer → payload → gateway."""
        assert self._compressor is not None and self._link is not None
        discarding = self._discarding() or self._silent(layer)
        if grad.is_cuda and not discarding:
            # GPU-resident path: reduce wait, residual and selection on a side stream; only the selection
            # crosses to the host (wanrt/client/leader/device_path.py, docs/client.md "On a GPU")
            payload = self._compressor.compress_tensor(layer, grad, work, float(self.site_scale()))
            self.own[(iteration, layer)] = payload  # weight prediction, as on the host path below
            self._link.push(iteration, layer, payload)
            return
        if work is not None:
            work.wait()
        if discarding:
            # a snapshot is pending: the gradient was computed at parameters known to differ from the
            # job's. An empty push keeps the round protocol whole (the site is seen, no round waits for
            # it) and carries no gradient; the residual is not fed either (the resync reset it). Also an
            # outer loop's silent layer (a fragment not synchronised now): its residual waits for its turn
            empty = SparsePayload.empty(layer, grad.numel(), self._settings.config.block_size)
            self._link.push(iteration, layer, empty)
            return
        flat = grad.detach().reshape(-1).to("cpu", torch.float32).numpy()
        # the site's mean gradient, weighted by the site's share of the job's samples (unequal batch sizes)
        # (changed only at the end of a step, after the step's pushes were drained: SettingsInForce.switch)
        payload = self._compressor.compress(layer, self.site_mean(layer, flat))
        self.own[(iteration, layer)] = payload  # read by the step's decision after the pipeline drained
        self._link.push(iteration, layer, payload)

    def site_mean(self, layer: int, flat: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Leader worker thread: the site's gradient sum scaled to the site's weighted mean.

        Why no new array per call: a fresh product of a 10 M-element layer was the worker's largest cost
        after selection (a 40 MB allocation, its page faults and a pass over memory, every iteration;
        docs/client.md, "Where an iteration's time goes"). A scale of exactly 1 (one rank, equal batch
        weights: every site of tools/bench_e2e.py) changes no bit, so the gradient is compressed as it is
        (the compressors never write their input); any other scale goes into a buffer kept per layer, with
        the same fp32 product as before, so the payloads are bit-identical either way.

        With ``local_steps`` k the gradient is the SUM of k micro-steps' gradients of mean-reduced losses
        (autograd accumulates), so the divisor is ranks × k: the site pushes its mean per sample over the
        k·b·ranks samples of the WAN iteration, times ``batch_weight`` (its share of the job's samples × the
        site count, which the scheduler computes from k·b; ElasticBSP §4, docs/local_steps.md). k = 1
        divides by ranks × 1, the same float as before.
        """
        scale = self.site_scale()
        if scale == np.float32(1.0):
            return flat
        buf = self._scaled.get(layer)
        if buf is None or buf.shape != flat.shape:
            buf = self._scaled[layer] = np.empty_like(flat)
        np.multiply(flat, scale, out=buf)
        return buf

    def site_scale(self) -> np.float32:
        """The factor from the site's gradient sum to its weighted mean (see :meth:`site_mean`)."""
        s = self._settings
        k = 1 if self._outer_loop else s.config.local_steps
        return np.float32(s.batch_weight / (self._world_size * k))
