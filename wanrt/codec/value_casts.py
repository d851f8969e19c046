"""Value arrays to and from their wire bytes: zero-copy where the dtype allows, one copy when it does not.

The wire is little-endian. Encoding in the payload's own dtype hands out a view of ``p.values``; a
downcast (``wire_dtype``) writes the one converted copy chunk by chunk, so the peak extra memory is the
output plus one cache-sized chunk of temporaries, never several full-size temporaries.

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

from wanrt.payload import VALUE_DTYPES, bf16_to_fp32, fp32_to_bf16

__all__ = ["WIRE_DTYPES", "cast_for_wire", "values_from_wire"]

#: wire name -> explicit little-endian dtype of the bytes on the wire.
WIRE_DTYPES: Final[dict[str, np.dtype[Any]]] = {
    "fp32": np.dtype("<f4"),
    "fp16": np.dtype("<f2"),
    "bf16": np.dtype("<u2"),
}

#: Elements converted per step of a downcast: 64 Ki fp32 = 256 KiB, inside L2, so the per-chunk temporaries
#: stay in cache and never add a second full-size copy to the peak.
_CHUNK: Final = 1 << 16

_LITTLE: Final = sys.byteorder == "little"


def _to_f32(values: npt.NDArray[Any], dtype: str) -> npt.NDArray[np.float32]:
    if dtype == "fp32":
        return values
    if dtype == "fp16":
        return values.astype(np.float32)
    return bf16_to_fp32(values)


def _convert_chunk(src: npt.NDArray[Any], src_dtype: str, dst_dtype: str, out: npt.NDArray[Any]) -> bool:
    """Write ``src`` converted into ``out``; False when a finite value overflowed fp16."""
    f32 = _to_f32(src, src_dtype)
    if dst_dtype == "fp32":
        out[...] = f32
    elif dst_dtype == "bf16":
        out[...] = fp32_to_bf16(f32)
    else:
        with np.errstate(over="ignore"):
            np.copyto(out, f32, casting="unsafe")
        inf = np.isinf(out)
        if inf.any() and bool(np.isfinite(f32[inf]).any()):
            return False
    return True


def cast_for_wire(values: npt.NDArray[Any], src_dtype: str, wire_dtype: str) -> tuple[npt.NDArray[Any], str]:
    """Values as a contiguous little-endian array in ``wire_dtype`` (or ``src_dtype`` on fp16 overflow).

    Returns ``(array, dtype_name)``. Same dtype on a little-endian host: a view, no copy.
    """
    if wire_dtype == src_dtype:
        arr = np.ascontiguousarray(values)
        return (arr if _LITTLE else arr.astype(WIRE_DTYPES[src_dtype])), src_dtype
    out = np.empty(values.shape[0], dtype=VALUE_DTYPES[wire_dtype])
    for start in range(0, values.shape[0], _CHUNK):
        stop = start + _CHUNK
        if not _convert_chunk(values[start:stop], src_dtype, wire_dtype, out[start:stop]):
            return cast_for_wire(values, src_dtype, src_dtype)
    return (out if _LITTLE else out.astype(WIRE_DTYPES[wire_dtype])), wire_dtype


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
