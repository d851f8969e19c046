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

from wanrt.client.config import ClientConfig
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

    def state_dict(self) -> dict[str, Any]:
        """The residuals and the compressor's per-layer thresholds, for a checkpoint: without them a
        resumed run selects other blocks than an uninterrupted one would (and loses what the residuals
        held back)."""
        return {
            "density": self._density,
            "error_feedback": None if self._ef is None else self._ef.state_dict(),
            "compressor": None if self._compressor is None else self._compressor.state_dict(),
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

    def compress(self, layer: int, grad: npt.NDArray[np.float32]) -> SparsePayload:
        if self._compressor is None:
            blocks = np.arange(n_blocks(grad.shape[0], self._block_size), dtype=np.int64)
            return SparsePayload.from_dense_blocks(layer, grad, blocks, self._block_size)
        if self._ef is not None:
            return self._ef.compress(layer, grad, self._compressor)
        return self._compressor.compress(layer, grad)
