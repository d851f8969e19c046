"""Turn whatever a trainer hands us (NumPy array, torch tensor, CuPy array) into a 1-D array *view*.

The kernels work in place on the caller's memory: a torch parameter is updated through its ``.numpy()``
view on CPU and through DLPack on CUDA, never through a copy (a copy would double the memory traffic that
the sparse optimizer exists to avoid, StellaTrain §3.1). Anything that cannot be viewed without a copy
(wrong dtype, non-contiguous, not 1-D, read-only when we must write) is refused with a
:class:`~wanrt.errors.KernelError` that says what to do instead.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any, Final, TypeAlias

import numpy as np

from wanrt.errors import KernelError
from wanrt.kernel_env import ENV_VAR

__all__ = [
    "CACHE_LINE",
    "INDEX_ERRORS",
    "Array",
    "aligned_zeros",
    "as_vector",
    "bump_torch_version",
    "check_block_indices",
    "is_cupy_array",
    "is_torch_tensor",
    "raise_index_error",
]

#: An array of the array-module pattern: ``numpy.ndarray`` or ``cupy.ndarray`` (cupy is optional, so this
#: cannot be spelled as a precise type without importing it).
Array: TypeAlias = Any


#: bytes per CPU cache line; a 16-float block is one line only if the array starts on a line boundary
CACHE_LINE = 64


def aligned_zeros(xp: ModuleType, n: int, dtype: Any) -> Array:
    """Zeros whose first element starts a cache line.

    Large NumPy allocations start 16 bytes into a page (the malloc header), so without this every 64-byte
    block of optimizer state straddles two cache lines and a sparse update touches twice the lines it
    needs (torch tensors and CuPy arrays are already aligned).
    """
    if xp is not np:
        return xp.zeros(n, dtype=dtype)
    item = np.dtype(dtype).itemsize
    raw = np.zeros(n + CACHE_LINE // item, dtype=dtype)
    off = (-raw.ctypes.data % CACHE_LINE) // item
    return raw[off : off + n]


def is_cupy_array(x: object) -> bool:
    """True for a ``cupy.ndarray``, decided without importing cupy."""
    return type(x).__module__.split(".", 1)[0] == "cupy"


def is_torch_tensor(x: object) -> bool:
    """True for a ``torch.Tensor`` (or subclass such as ``Parameter``), decided without importing torch."""
    return any(c.__module__.split(".", 1)[0] == "torch" and c.__name__ == "Tensor" for c in type(x).__mro__)


def _torch_view(x: Any, what: str, writable: bool) -> Array:
    t = x.detach()
    if t.dim() != 1:
        raise KernelError(f"{what} must be a 1-D tensor (use .view(-1))", value=tuple(t.shape))
    if str(t.dtype) != "torch.float32":
        raise KernelError(f"{what} must be float32", value=str(t.dtype))
    if not t.is_contiguous():
        raise KernelError(f"{what} must be contiguous (a view into it would need a copy)")
    if t.device.type == "cpu":
        return t.numpy()
    if t.device.type == "cuda":
        try:
            import cupy
        except ImportError:
            raise KernelError(
                f"{what} is a CUDA tensor but cupy is not installed (pip install wanrt[gpu])"
            ) from None
        return _cupy_view(cupy, t)
    raise KernelError(f"{what} is on device {t.device.type!r}; only cpu and cuda are supported")


def cuda_stream_ptr(t: Any) -> int:
    """torch's current stream on a CUDA tensor's device, as a raw pointer.

    ``torch.cuda.current_stream()`` builds a Python Stream object per call (2-4 µs on an H200's host);
    torch's own raw accessor returns the pointer in 0.1 µs, and is used where this torch has it."""
    import torch

    dev = t.device.index if t.device.index is not None else torch.cuda.current_device()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return int(raw(dev))
    return int(torch.cuda.current_stream(dev).cuda_stream)


def same_streams(t: Any) -> bool:
    """True when torch's current stream on ``t``'s device is CuPy's current stream (no handshake needed)."""
    import cupy

    return cuda_stream_ptr(t) == int(cupy.cuda.get_current_stream().ptr)


def forced_env() -> str:
    """The raw ``WANRT_KERNELS`` setting (part of a cached kernel choice's key)."""
    return os.environ.get(ENV_VAR, "")


def _cupy_view(cupy: Any, t: Any) -> Array:
    """A CuPy array over a contiguous 1-D fp32 CUDA tensor's memory, holding the tensor alive.

    Why not ``cupy.from_dlpack``: DLPack's stream handshake makes torch create, record and wait on an
    event in Python on every call (~0.05-0.1 ms, measured on an H200: a fifth of a 25 M-element
    selection, issue 26), although the hot callers already run on the stream that produced the tensor:
    the leader's side stream is torch's and CuPy's current stream at once, and an optimizer step runs on
    the default stream of both. The handshake is kept (through DLPack) whenever the two libraries'
    current streams differ, so ordering never depends on this shortcut."""
    import torch

    n = int(t.numel())
    dev = t.device.index if t.device.index is not None else torch.cuda.current_device()
    if n == 0 or not same_streams(t):
        return cupy.from_dlpack(t)
    mem = cupy.cuda.UnownedMemory(t.data_ptr(), n * 4, t, dev)
    return cupy.ndarray((n,), dtype=cupy.float32, memptr=cupy.cuda.MemoryPointer(mem, 0))


def as_vector(x: object, what: str = "array", *, writable: bool = False) -> Array:
    """A 1-D contiguous float32 view of ``x`` (NumPy, CuPy or torch), or a :class:`KernelError`."""
    if is_torch_tensor(x):
        return _torch_view(x, what, writable)
    if isinstance(x, np.ndarray):
        arr: Array = x
        if writable and not x.flags.writeable:
            raise KernelError(f"{what} is read-only but must be updated in place")
    elif is_cupy_array(x):
        arr = x
    else:
        raise KernelError(f"{what} must be a NumPy/CuPy array or a torch tensor", value=type(x).__name__)
    if arr.ndim != 1:
        raise KernelError(f"{what} must be 1-D (use .reshape(-1))", value=tuple(arr.shape))
    if arr.dtype != np.float32:
        raise KernelError(f"{what} must be float32", value=str(arr.dtype))
    if not arr.flags.c_contiguous:
        raise KernelError(f"{what} must be contiguous (a view into it would need a copy)")
    return arr


def bump_torch_version(x: object) -> None:
    """Tell autograd a tensor was modified in place behind its back (through a NumPy/DLPack view).

    Without this, a graph that saved the parameter before our in-place update would silently use the new
    values in backward; with it, torch raises its usual "modified by an inplace operation" error.
    """
    if not is_torch_tensor(x):
        return
    import torch

    if isinstance(x, torch.Tensor):
        torch.autograd.graph.increment_version(x)


#: What is wrong with a sparse update, by the code the fused kernels return (0: nothing). Every path says it
#: in the same words, so a bad update is refused alike whichever kernel would have applied it.
INDEX_ERRORS: Final = {
    1: "update block index out of range",
    2: "update block indices are not strictly increasing",
    3: "a block's step count exceeds the bias-correction table (corrupt optimizer state?)",
}


def check_block_indices(xp: ModuleType, idx: Array, nb: int) -> None:
    """The host check before a sparse update of ``nb`` blocks: indices in range and strictly increasing,
    since a scatter would otherwise write outside the array or apply one block twice. ``xp`` is the array
    module of ``idx`` (the reference and CuPy paths; the fused kernels check inside and report
    :data:`INDEX_ERRORS` codes, raised by :func:`raise_index_error`)."""
    k = int(idx.shape[0])
    if k == 0:
        return
    if int(idx[0]) < 0 or int(idx[-1]) >= nb:
        raise KernelError(INDEX_ERRORS[1], limit=nb, value=int(idx[-1]))
    if k > 1 and not bool(xp.all(idx[1:] > idx[:-1])):
        raise KernelError(INDEX_ERRORS[2])


def raise_index_error(code: int, nb: int) -> None:
    """Raise the :class:`~wanrt.errors.KernelError` a fused kernel's return ``code`` stands for (0: none)."""
    if code:
        raise KernelError(INDEX_ERRORS.get(int(code), "bad update indices"), limit=nb)
