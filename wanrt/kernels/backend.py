"""Which kernel path runs: the NumPy reference, the fused CPU path (numba) or CuPy.

Which path runs is decided by the one chooser, :mod:`wanrt.kernel_env` (shared with the codec): CuPy for
CuPy arrays (and CUDA tensors), the fused path for host arrays — falling back to the NumPy reference only
when numba cannot be imported. This module builds the path objects. ``WANRT_KERNELS=numpy|fused|cupy``
forces a path, e.g. to rule a kernel out while debugging or to measure one against another; a value we do
not know, or a path that is unavailable or cannot handle the array at hand, is a
:class:`~wanrt.errors.KernelError` saying so (a silent fallback would make "I forced the reference and the
bug persists" meaningless).

The environment is read on every call by the one parser in :mod:`wanrt.kernel_env` (shared with the
codec), not at import, so a test or a benchmark can switch paths at run time and importing wanrt has no
side effects. The path objects are built lazily, once.
"""

from __future__ import annotations

import threading

from wanrt.errors import KernelError
from wanrt.kernel_env import ENV_VAR, PATHS, default_path, forced_path, requested_path
from wanrt.kernels.arrays import Array, is_cupy_array
from wanrt.kernels.reference import ReferenceKernels, numpy_reference

__all__ = ["ENV_VAR", "PATHS", "available_paths", "get_kernels", "kernels_by_name", "requested_path"]

_lock = threading.Lock()
_built: dict[str, ReferenceKernels] = {}
_failed: dict[str, str] = {}


def _build(name: str) -> ReferenceKernels:
    if name == "numpy":
        return numpy_reference()
    if name == "fused":
        try:
            from wanrt.kernels.fused_cpu import FusedKernels
        except ImportError as exc:
            raise KernelError(f"the fused CPU path needs numba, which failed to import: {exc}") from None
        return FusedKernels()
    try:
        import cupy
    except ImportError as exc:
        raise KernelError(f"the cupy path needs cupy (pip install wanrt[gpu]): {exc}") from None
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise KernelError("the cupy path needs a CUDA device and none is visible")
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        raise KernelError(f"the cupy path needs a working CUDA runtime: {exc}") from None
    from wanrt.kernels.cupy_kernels import CupyKernels

    return CupyKernels(cupy)


def kernels_by_name(name: str) -> ReferenceKernels:
    """The kernels of path ``name`` (built on first use); KernelError if unknown or unavailable."""
    if name not in PATHS:
        raise KernelError(f"unknown kernel path {name!r}; use one of {', '.join(PATHS)}", value=name)
    with _lock:
        if name in _built:
            return _built[name]
        if name in _failed:
            raise KernelError(_failed[name])
        try:
            k = _build(name)
        except KernelError as exc:
            _failed[name] = exc.message
            raise
        _built[name] = k
        return k


def available_paths() -> list[str]:
    """Paths that can run here (for tests and the benchmark)."""
    out = []
    for name in PATHS:
        try:
            kernels_by_name(name)
        except KernelError:
            continue
        out.append(name)
    return out


def get_kernels(x: Array) -> ReferenceKernels:
    """The kernels to run on array ``x``: forced by ``WANRT_KERNELS`` or chosen by where ``x`` lives
    (the rules: :mod:`wanrt.kernel_env`)."""
    on_device = is_cupy_array(x)
    forced = forced_path(on_device=on_device)
    if forced is not None:
        return kernels_by_name(forced)
    path = default_path(on_device=on_device)
    if path != "fused":
        return kernels_by_name(path)
    try:
        return kernels_by_name("fused")
    except KernelError:
        return kernels_by_name("numpy")
