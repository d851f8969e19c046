"""The site leader's per-layer gradient compression: error feedback + a :mod:`wanrt.kernels` compressor.

StellaTrain §3.2: the leader selects the largest cache-line blocks (threshold-v with an AIMD threshold) and
keeps what it left out in an error-feedback residual that is added to the next gradient, so nothing is lost,
only delayed. With ``density == 1`` (the dense baseline) every block is selected: the payload is the whole
averaged gradient in COO form and travels the very same path, so a dense and a sparse run differ only in
configuration.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from wanrt.client.config import LOWBIT_WIRE, ClientConfig
from wanrt.client.leader.value_coding import ValueCoder
from wanrt.client.leader.wire_buffers import WireBuffers
from wanrt.codec.value_casts import in_wire_dtype
from wanrt.kernels import Compressor, ErrorFeedback, make_compressor
from wanrt.payload import SparsePayload, n_blocks

__all__ = ["LayerCompressor"]


class LayerCompressor:
    """Compresses one layer's averaged gradient per call; keeps the per-layer threshold and residual state."""

    def __init__(self, config: ClientConfig) -> None:
        self._block_size = config.block_size
        self._kind = config.compressor
        self._density = config.density
        self._ef = ErrorFeedback() if config.error_feedback and config.compressing else None
        self._compressor: Compressor | None = self._make(config.density)
        self._wire_dtype = config.wire_dtype
        lowbit = config.wire_dtype in LOWBIT_WIRE
        #: low-bit values: quantised here after selection, the error kept (leader/value_coding.py)
        self._coder = ValueCoder(config.wire_dtype, config.scale_block) if lowbit else None
        self._all_blocks: dict[int, npt.NDArray[np.int64]] = {}  # n_blocks -> arange (dense payloads)
        self.buffers = WireBuffers(config.reuse_wire_buffer_bytes)  # large dense layers' cast targets

    def _make(self, density: float) -> Compressor | None:
        if density >= 1.0:
            return None
        return make_compressor(self._kind, density=density, block_size=self._block_size)

    @property
    def density(self) -> float:
        return self._density

    def set_density(self, density: float) -> None:
        """Switch the compression rate (a scheduler decision); the residual carries over unchanged."""
        if density == self._density:
            return
        self._density = density
        if self._compressor is not None and density < 1.0:
            self._compressor.density = density  # keeps the per-layer AIMD thresholds
        else:
            self._compressor = self._make(density)

    def reset_residuals(self) -> None:
        """Forget every layer's error-feedback residual (a parameter resync: what the residual held was
        computed at parameters that were not the job's, so sending it later would be as wrong as sending
        the gradients it came from). The AIMD thresholds stay: they track magnitudes, not a direction."""
        if self._ef is not None:
            self._ef.reset()
        if self._coder is not None:
            self._coder.reset()

    def state_dict(self) -> dict[str, Any]:
        """The residuals and the compressor's per-layer thresholds, for a checkpoint: without them a
        resumed run selects other blocks than an uninterrupted one would (and loses what the residuals
        held back)."""
        return {
            "density": self._density,
            "error_feedback": None if self._ef is None else self._ef.state_dict(),
            "compressor": None if self._compressor is None else self._compressor.state_dict(),
            "value_coding": None if self._coder is None else self._coder.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ef, comp = state.get("error_feedback"), state.get("compressor")
        if self._ef is not None:
            if isinstance(ef, dict):
                self._ef.load_state_dict(ef)
            else:
                self._ef.reset()
        if self._compressor is not None and isinstance(comp, dict):
            self._compressor.load_state_dict(comp)
        if self._coder is not None:
            self._coder.load_state_dict(state.get("value_coding"))

    def compress(self, layer: int, grad: npt.NDArray[np.float32]) -> SparsePayload:
        if self._compressor is None:
            return self.code_values(self._dense(layer, grad), None)
        if self._ef is not None:
            p = self._ef.compress(layer, grad, self._compressor)
            return self.code_values(p, self._ef.residual(layer))
        return self.code_values(self._compressor.compress(layer, grad), None)

    def code_values(self, p: SparsePayload, residual: Any | None) -> SparsePayload:
        """``p`` in the low-bit wire coding, its error kept in ``residual`` (sparse) or in the coder's own
        dense residual (``p`` dense); ``p`` itself without a low-bit coding."""
        if self._coder is None:
            return p
        return self._coder.dense(p) if self._compressor is None else self._coder.sparse(p, residual)

    def _dense(self, layer: int, grad: npt.NDArray[np.float32]) -> SparsePayload:
        """Every block of ``grad``, cast to the wire dtype here, in the one pass that copies it.

        Why here: gathering every block (``from_dense_blocks``) made a layer-sized fp32 copy that the
        link's fp16/bf16 cast copied again right after (2–35 ms at 5–25 M elements, docs/round_bench.md,
        "Through the client"); cast from the gradient itself, the payload is made in one pass and the link
        sends it as it is. The payload owns its values (a link may keep it to re-send after a reconnect
        while the caller's gradient memory is reused): the fp32 wire, the rare fp16 cast that falls back
        to fp32 (a value would overflow) and a layer whose last block needs zero padding get a copy.
        A large layer's cast (or copy) is written into a buffer kept from an earlier step once nothing
        else holds it (:mod:`wanrt.client.leader.wire_buffers`: no fresh pages to fault in every step).
        """
        n = int(grad.shape[0])
        nb = n_blocks(n, self._block_size)
        blocks = self._all_blocks.get(nb)
        if blocks is None:
            blocks = self._all_blocks[nb] = np.arange(nb, dtype=np.int64)
            blocks.flags.writeable = False  # shared by every dense payload of this layer size
        if self._coder is not None:  # low-bit: compress() quantises it into values of its own
            if n % self._block_size:
                return SparsePayload.from_dense_blocks(layer, grad, blocks, self._block_size)
            return SparsePayload(layer, n, self._block_size, blocks, grad, "fp32")
        if n % self._block_size:  # the last block is padded: a gathered copy, then the same cast
            gathered = SparsePayload.from_dense_blocks(layer, grad, blocks, self._block_size)
            return in_wire_dtype(gathered, self._wire_dtype)
        view = SparsePayload(layer, n, self._block_size, blocks, grad, "fp32")
        if self._wire_dtype != "fp32":  # a large layer's cast goes into a reused buffer (wire_buffers)
            out = self.buffers.take(layer, n, np.uint16 if self._wire_dtype == "bf16" else np.float16)
            wire = in_wire_dtype(view, self._wire_dtype, out)
            del out
            if wire is not view:
                return wire
        # nothing was cast (fp32 wire, or an fp16 overflow): the payload's own copy
        copy = self.buffers.take(layer, n, np.float32)
        if copy is None:
            return SparsePayload(layer, n, self._block_size, blocks, grad.copy(), "fp32")
        np.copyto(copy, grad)
        return SparsePayload(layer, n, self._block_size, blocks, copy, "fp32")
