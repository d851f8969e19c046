"""Which kernel path encodes or decodes one payload: the fused (numba) loops, or the NumPy reference.

Which path a payload takes is decided by the one chooser, :mod:`wanrt.kernel_env` (shared with the
compression kernels); this module loads the kernels of that path. Both give bit-identical output (the tests
check it), so the choice is about cost only, and the cost of the fused path is mostly paid once per process:
importing numba and LLVM and compiling (or loading from the disk cache) seven kernels takes ~130 MB of
resident memory and one to a few seconds of CPU. A gateway that only ever relays small payloads never earns
that back, and 32 gateways on one machine paid it 32 times (``tree32_rss_mb`` of ``tools/bench_gateway.py``).
So, when ``WANRT_KERNELS`` forces nothing:

* a payload of fewer than :data:`~wanrt.kernel_env.FUSED_MIN_VALUES` value slots takes the NumPy path,
  always;
* the first larger one starts loading the fused kernels in a background thread (:class:`FusedLoader`)
  and is itself served by the NumPy path, as is every large payload until the kernels are compiled; from
  then on large payloads take the fused path. A gateway therefore never stalls its event loop (and its
  heartbeats) on a compile inside a round, and never loads numba unless it sees a large payload.

``WANRT_KERNELS`` (one parser: :mod:`wanrt.kernel_env`): ``numpy`` forces the reference for every payload;
``fused`` forces the fused kernels for every payload, loaded on the spot (a :class:`KernelError` without
numba); ``cupy`` is treated as unset, since the codec only ever works on host bytes.
"""

from __future__ import annotations

import logging
import threading
from typing import Final, Protocol

import numpy as np
import numpy.typing as npt

from wanrt.codec.reference_kernels import NumpyCodecKernels
from wanrt.errors import KernelError
from wanrt.kernel_env import ENV_VAR, FUSED_MIN_VALUES, default_path, forced_path

__all__ = [
    "KERNEL_ENV",
    "CodecKernels",
    "FusedLoader",
    "codec_kernels",
    "fused_loader",
]

log = logging.getLogger(__name__)

#: the variable that forces a path (same name and parser as :mod:`wanrt.kernels`)
KERNEL_ENV: Final = ENV_VAR


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

    def f32_to_f16(
        self, values: npt.NDArray[np.float32], out: npt.NDArray[np.float16] | None = None
    ) -> tuple[npt.NDArray[np.float16], bool]: ...

    def f32_to_bf16(
        self, values: npt.NDArray[np.float32], out: npt.NDArray[np.uint16] | None = None
    ) -> npt.NDArray[np.uint16]: ...


class FusedLoader:
    """Loads and compiles the fused kernels once, in a background thread, on request.

    Thread-safe; :meth:`ready` never blocks. Without numba (or if compiling fails) the loader logs why once
    and the codec keeps the NumPy path: the output is the same, only slower.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._kernels: CodecKernels | None = None
        self._error: str | None = None

    @property
    def started(self) -> bool:
        return self._thread is not None

    @property
    def error(self) -> str | None:
        """Why the fused kernels could not be loaded (None while loading or once loaded)."""
        return self._error

    def ready(self) -> CodecKernels | None:
        """The compiled fused kernels, or None while they are not (yet) loaded."""
        return self._kernels

    def start(self) -> None:
        """Begin loading in a daemon thread (idempotent)."""
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._load, name="wanrt-codec-fused", daemon=True)
            self._thread.start()

    def wait(self, timeout: float | None = None) -> CodecKernels | None:
        """Start loading if nobody did, then wait up to ``timeout`` s for it (tests, benchmarks)."""
        self.start()
        self._done.wait(timeout)
        return self._kernels

    def _load(self) -> None:
        try:
            from wanrt.codec.fused_kernels import compile_all, load

            kernels = load()
            compile_all(kernels)
        except Exception as exc:  # ImportError without numba, or a compiler failure: keep the reference
            self._error = f"{type(exc).__name__}: {exc}"
            log.warning("codec: fused kernels unavailable, large payloads keep the NumPy path (%s)", exc)
        else:
            self._kernels = kernels
            log.info("codec: fused kernels loaded for payloads of >= %d values", FUSED_MIN_VALUES)
        finally:
            self._done.set()


_LOADER = FusedLoader()
_REFERENCE: Final = NumpyCodecKernels()


def fused_loader() -> FusedLoader:
    """This process's loader (one per process: the compiled kernels are shared by every caller)."""
    return _LOADER


def codec_kernels(mode: str | None = None, *, values: int = 0) -> CodecKernels:
    """The kernels for a payload of ``values`` value slots (the rules: :mod:`wanrt.kernel_env`).

    ``mode`` overrides ``$WANRT_KERNELS`` (same values). Unforced, a payload below
    :data:`~wanrt.kernel_env.FUSED_MIN_VALUES` gets the reference; a larger one gets the fused kernels once
    the background load has finished, the reference before (and starts the load). Raises
    :class:`KernelError` for an unknown mode, or for ``fused`` without numba.
    """
    forced = forced_path(codec=True, mode=mode)
    if forced == "fused":
        try:
            from wanrt.codec.fused_kernels import load

            return load()
        except ImportError as exc:
            raise KernelError(f"{ENV_VAR}=fused needs numba: {exc}", key=ENV_VAR, value=forced) from exc
    if (forced or default_path(values=values)) == "numpy":
        return _REFERENCE
    fused = _LOADER.ready()
    if fused is not None:
        return fused
    _LOADER.start()
    return _REFERENCE
