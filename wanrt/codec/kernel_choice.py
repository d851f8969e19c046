"""Which kernel path the codec runs: the fused (numba) loops, or the NumPy reference.

Chosen per call from ``WANRT_KERNELS`` (shared with :mod:`wanrt.kernels`): ``numpy`` forces the reference,
``fused`` requires numba, anything else that wanrt knows (unset, ``cupy``) takes the fused path when numba
imports and the reference otherwise. The codec always runs on the host, so ``cupy`` means "fastest CPU".
"""

from __future__ import annotations

import os
from typing import Final, Protocol

import numpy as np
import numpy.typing as npt

from wanrt.errors import KernelError

__all__ = ["KERNEL_ENV", "CodecKernels", "codec_kernels"]

KERNEL_ENV: Final = "WANRT_KERNELS"

_KNOWN: Final = ("", "numpy", "fused", "cupy")


class CodecKernels(Protocol):
    """What both paths implement (semantics in :mod:`wanrt.codec.reference_kernels`)."""

    name: str

    def gap_stats(self, indices: npt.NDArray[np.int64], n_blocks: int) -> tuple[bool, int, int]: ...

    def varint_encode(self, indices: npt.NDArray[np.int64], nbytes: int) -> npt.NDArray[np.uint8]: ...

    def varint_decode(
        self, b: npt.NDArray[np.uint8], count: int, n_blocks: int, *, peer: str | None = None
    ) -> npt.NDArray[np.int64]: ...

    def bitmap_encode(self, indices: npt.NDArray[np.int64], n_blocks: int) -> npt.NDArray[np.uint8]: ...

    def bitmap_decode(
        self, b: npt.NDArray[np.uint8], count: int, *, peer: str | None = None
    ) -> npt.NDArray[np.int64]: ...

    def f32_to_f16(self, values: npt.NDArray[np.float32]) -> tuple[npt.NDArray[np.float16], bool]: ...

    def f32_to_bf16(self, values: npt.NDArray[np.float32]) -> npt.NDArray[np.uint16]: ...


def codec_kernels(mode: str | None = None) -> CodecKernels:
    """The kernels for ``mode`` (default: ``$WANRT_KERNELS``); raises :class:`KernelError` if unavailable."""
    if mode is None:
        mode = os.environ.get(KERNEL_ENV, "")
    mode = mode.strip().lower()
    if mode not in _KNOWN:
        raise KernelError(f"{KERNEL_ENV} must be one of numpy, fused, cupy", value=mode)
    from wanrt.codec.reference_kernels import ReferenceKernels

    if mode == "numpy":
        return ReferenceKernels()
    try:
        from wanrt.codec.fused_kernels import load

        return load()
    except ImportError as exc:
        if mode == "fused":
            raise KernelError(f"{KERNEL_ENV}=fused needs numba: {exc}") from exc
        return ReferenceKernels()
