"""Value arrays to and from their wire bytes: zero-copy where the dtype allows, one copy when it does not.

The wire is little-endian. Encoding in the payload's own dtype hands out a view of ``p.values``; a
downcast (``wire_dtype``) writes the one converted copy in a single pass (fused path) or chunk by chunk
(NumPy reference), so the peak extra memory is the output plus at most one cache-sized chunk of
temporaries, never several full-size temporaries.

fp16 overflow policy (see ``docs/codec.md``): a finite value that fp16 would turn into ±inf (|x| >= 65520
after round-to-nearest-even) makes :func:`cast_for_wire` give up the downcast and send the payload in its
own dtype. Clamping would silently change the update by more than the error-feedback residual knows about,
and rejecting would fail a training step over one large gradient; paying bandwidth for a rare payload is
the only choice that loses nothing.
"""

from __future__ import annotations

import sys
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from wanrt.codec.kernel_choice import CodecKernels, codec_kernels
from wanrt.codec.lowbit import CODING_BITS, quantise_payload, usable_coded
from wanrt.payload import VALUE_DTYPES, SparsePayload, bf16_to_fp32

__all__ = ["WIRE_DTYPES", "cast_for_wire", "in_wire_dtype", "values_from_wire"]

#: wire name -> explicit little-endian dtype of the bytes on the wire.
WIRE_DTYPES: Final[dict[str, np.dtype[Any]]] = {
    "fp32": np.dtype("<f4"),
    "fp16": np.dtype("<f2"),
    "bf16": np.dtype("<u2"),
}

_LITTLE: Final = sys.byteorder == "little"


def _to_f32(values: npt.NDArray[Any], dtype: str) -> npt.NDArray[np.float32]:
    return values.astype(np.float32) if dtype == "fp16" else bf16_to_fp32(values)


def _downcast(
    f32: npt.NDArray[np.float32],
    wire_dtype: str,
    kernels: CodecKernels,
    out: npt.NDArray[Any] | None = None,
) -> npt.NDArray[Any] | None:
    """fp32 -> ``wire_dtype`` (one new array, or ``out``), or None when fp16 would overflow a finite
    value."""
    if wire_dtype == "fp32":
        return f32
    if wire_dtype == "bf16":
        return kernels.f32_to_bf16(f32, out)
    cast, overflow = kernels.f32_to_f16(f32, out)
    return None if overflow else cast


def cast_for_wire(
    values: npt.NDArray[Any],
    src_dtype: str,
    wire_dtype: str,
    kernels: CodecKernels,
    out: npt.NDArray[Any] | None = None,
) -> tuple[npt.NDArray[Any], str]:
    """Values as a contiguous little-endian array in ``wire_dtype`` (or ``src_dtype`` on fp16 overflow).

    Returns ``(array, dtype_name)``. Same dtype on a little-endian host: a view of ``values``, no copy.
    From fp32: one new array, written by a single fused pass. From fp16/bf16 (rare: payloads are built in
    fp32) via a temporary fp32 copy. ``out``: a 16-bit array of ``values``' length that a downcast
    writes instead of a new one (a buffer the caller reuses; left as it is when nothing is cast).
    """
    if wire_dtype != src_dtype:
        f32 = values if src_dtype == "fp32" else _to_f32(values, src_dtype)
        cast = _downcast(f32, wire_dtype, kernels, out)
        if cast is not None:
            return (cast if _LITTLE else cast.astype(WIRE_DTYPES[wire_dtype])), wire_dtype
    arr = np.ascontiguousarray(values)
    return (arr if _LITTLE else arr.astype(WIRE_DTYPES[src_dtype])), src_dtype


def in_wire_dtype(p: SparsePayload, wire_dtype: str, out: npt.NDArray[Any] | None = None) -> SparsePayload:
    """``p`` with its values cast to ``wire_dtype`` by :func:`cast_for_wire` (same rounding, same fp16
    overflow policy: ``p`` itself when a value would overflow), for a sender that must hand a payload,
    not options, to the protocol (the trainer client's ``Push``). ``p`` itself when nothing changes.
    A low-bit ``wire_dtype``: ``p`` when it carries those codes already (the layer compressor quantised it
    and kept the error), else :func:`~wanrt.codec.lowbit.quantise_payload` with the default scale block.
    ``out``: see :func:`cast_for_wire` (the values of the result, when a 16-bit downcast happened)."""
    if wire_dtype in CODING_BITS:  # low-bit: the codes a quantising caller attached, else quantised here
        coded = usable_coded(p)
        return p if coded is not None and coded.coding == wire_dtype else quantise_payload(p, wire_dtype)
    if wire_dtype == p.value_dtype:
        return p
    kernels = codec_kernels(values=p.nnz)
    values, dtype = cast_for_wire(p.values, p.value_dtype, wire_dtype, kernels, out)
    if dtype == p.value_dtype:
        return p
    native = values.astype(VALUE_DTYPES[dtype], copy=False)  # a no-op on a little-endian host
    return SparsePayload(p.layer, p.dense_len, p.block_size, p.indices, native, dtype)


def values_from_wire(buf: memoryview, dtype: str) -> npt.NDArray[Any]:
    """Read-only view of ``buf`` as values; a copy only if the bytes are misaligned or the host big-endian.

    Misaligned views are legal in NumPy but slow and refused by some compiled kernels, so the decoder
    trades one copy for an aligned array (the protocol avoids this by aligning buffers in the frame).
    """
    wire = WIRE_DTYPES[dtype]
    arr = np.frombuffer(buf, dtype=wire)
    if not _LITTLE:
        return arr.astype(VALUE_DTYPES[dtype])
    if not arr.flags.aligned:
        return arr.copy()
    return arr
