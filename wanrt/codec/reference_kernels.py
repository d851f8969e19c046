"""NumPy reference kernels of the codec: gap statistics, delta + LEB128 varint, bitmaps, fp32 -> fp16/bf16.

These define what the fused (numba) kernels in :mod:`wanrt.codec.fused_kernels` must compute; tests check
the two against each other, and ``WANRT_KERNELS=numpy`` forces this path. Vectorised with one masked pass
per byte position, they are correct but 10-20x slower than the fused loop on the 1 %-density layers wanrt
sends (measured by ``tools/bench_codec.py``); payloads below ``FUSED_MIN_VALUES`` always take this path
(:mod:`wanrt.codec.kernel_choice`), where the fixed per-call cost of either path dominates.

Gaps are ``idx[i] - idx[i-1] - 1`` with ``idx[-1] = -1``, so every valid gap is ``>= 0`` and a strictly
increasing sequence is the only thing a gap stream can express.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import numpy.typing as npt

from wanrt.errors import KernelError, MalformedPayload
from wanrt.payload import fp32_to_bf16

__all__ = [
    "NumpyCodecKernels",
    "bitmap_decode",
    "bitmap_encode",
    "cast_output",
    "f32_to_bf16",
    "f32_to_f16",
    "gap_stats",
    "gaps_of",
    "max_varint_len",
    "varint_decode",
    "varint_encode",
    "varint_lengths",
]

Int64Array = npt.NDArray[np.int64]
U8Array = npt.NDArray[np.uint8]
U16Array = npt.NDArray[np.uint16]

#: Elements converted per step of a downcast: 64 Ki fp32 = 256 KiB, inside L2, so the per-chunk temporaries
#: stay in cache and never add a second full-size copy to the peak.
_CHUNK: Final = 1 << 16


def gaps_of(indices: Int64Array) -> Int64Array:
    """``gap`` stream of ``indices`` (``d[0] = idx[0]``, ``d[i] = idx[i] - idx[i-1] - 1``)."""
    g = np.empty_like(indices)
    if indices.shape[0]:
        g[0] = indices[0]
        np.subtract(indices[1:], indices[:-1], out=g[1:])
        g[1:] -= 1
    return g


def varint_lengths(gaps: Int64Array) -> U8Array:
    """LEB128 byte length of each (non-negative) gap: one byte per 7 bits."""
    lens = np.ones(gaps.shape[0], dtype=np.uint8)
    if gaps.shape[0] == 0:
        return lens
    gmax = int(gaps.max())
    shift = 7
    while shift < 63 and gmax >= (1 << shift):
        lens += gaps >= (1 << shift)
        shift += 7
    return lens


def max_varint_len(n_blocks: int) -> int:
    """Longest varint a valid stream can hold: every gap is ``< n_blocks``."""
    return max(1, -(-max(n_blocks - 1, 0).bit_length() // 7))


#: Index counts up to which the varint kernels loop over Python ints instead of NumPy arrays: a NumPy call
#: costs ~1-2 us whatever its size, and the array path makes a dozen of them, so a payload of a few blocks
#: (a 1 %-dense small layer, the simulator's 1 000 sites) spent ~50 us per encode or decode on overhead.
#: The loops are the same arithmetic, so the output (and every error) is the same.
SMALL_COUNT: Final = 32


def _small_gap_stats(idx: list[int], n_blocks: int) -> tuple[bool, int, int]:
    prev, maxg, nbytes = -1, 0, 0
    for x in idx:
        g = x - prev - 1
        if g < 0:
            return False, 0, 0
        maxg = max(maxg, g)
        nbytes += max(1, -(-g.bit_length() // 7))
        prev = x
    if prev >= n_blocks:
        return False, 0, 0
    return True, maxg, nbytes


def gap_stats(indices: Int64Array, n_blocks: int) -> tuple[bool, int, int]:
    """``(valid, max_gap, varint_bytes)``; ``valid`` is False unless strictly increasing and in range."""
    if indices.shape[0] == 0:
        return True, 0, 0
    if indices.shape[0] <= SMALL_COUNT:
        return _small_gap_stats(indices.tolist(), n_blocks)
    g = gaps_of(indices)
    if int(g.min()) < 0 or int(indices[-1]) >= n_blocks:
        return False, 0, 0
    return True, int(g.max()), int(varint_lengths(g).sum(dtype=np.int64))


def varint_encode(indices: Int64Array, nbytes: int) -> U8Array:
    """Delta + LEB128 of valid indices (``nbytes`` from :func:`gap_stats`), one masked pass per byte."""
    if 0 < indices.shape[0] <= SMALL_COUNT:
        return _small_varint_encode(indices.tolist(), nbytes)
    gaps = gaps_of(indices)
    lens = varint_lengths(gaps)
    if int(lens.sum(dtype=np.int64)) != nbytes:
        raise KernelError("varint_encode: nbytes disagrees with the indices", value=nbytes)
    if gaps.shape[0] == 0:
        return np.zeros(0, dtype=np.uint8)
    ends = np.cumsum(lens, dtype=np.int64)
    out = np.empty(int(ends[-1]), dtype=np.uint8)
    starts = ends - lens
    g = gaps.view(np.uint64)
    for k in range(int(lens.max())):
        if k == 0:
            sel_starts, sel_g, sel_lens = starts, g, lens
        else:
            m = lens > k
            sel_starts, sel_g, sel_lens = starts[m], g[m], lens[m]
        byte = ((sel_g >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8)
        byte |= (sel_lens > k + 1).astype(np.uint8) << np.uint8(7)
        out[sel_starts + k] = byte
    return out


def _small_varint_encode(idx: list[int], nbytes: int) -> U8Array:
    out = bytearray()
    prev = -1
    for x in idx:
        g = (x - prev - 1) & 0xFFFF_FFFF_FFFF_FFFF  # as the array path's uint64 view
        prev = x
        while g >= 0x80:
            out.append((g & 0x7F) | 0x80)
            g >>= 7
        out.append(g)
    if len(out) != nbytes:
        raise KernelError("varint_encode: nbytes disagrees with the indices", value=nbytes)
    return np.frombuffer(out, dtype=np.uint8).copy()


def _small_varint_decode(data: bytes, count: int, n_blocks: int, peer: str | None) -> Int64Array:
    """:func:`varint_decode` for a stream of at most :data:`SMALL_COUNT` bytes (same checks, same order)."""
    ends = sum(1 for c in data if c < 0x80)
    if ends != count:
        raise _bad("number of varints disagrees with count", peer, limit=count, value=ends)
    if data[-1] >= 0x80:
        raise _bad("stream ends inside a varint", peer, value=len(data))
    maxlen = max_varint_len(n_blocks)
    gaps: list[int] = []
    longest = 0
    g = shift = n = 0
    for c in data:
        g |= (c & 0x7F) << shift
        shift += 7
        n += 1
        if c < 0x80:
            gaps.append(g)
            longest = max(longest, n)
            g = shift = n = 0
    if longest > maxlen:
        raise _bad("varint longer than any valid gap", peer, limit=maxlen, value=longest)
    top = max(gaps)
    if top >= n_blocks:
        raise _bad("gap beyond the layer", peer, limit=n_blocks, value=top)
    out: list[int] = []
    prev = -1
    for g in gaps:
        prev = prev + g + 1
        out.append(prev)
    if prev >= n_blocks:
        raise _bad("index beyond the layer", peer, limit=n_blocks, value=prev)
    return np.array(out, dtype=np.int64)


def _bad(msg: str, peer: str | None, **fields: Any) -> MalformedPayload:
    return MalformedPayload(f"varint index stream: {msg}", peer=peer, **fields)


def varint_decode(b: U8Array, count: int, n_blocks: int, *, peer: str | None = None) -> Int64Array:
    """Exactly ``count`` varints filling ``b`` exactly -> strictly increasing indices ``< n_blocks``.

    The caller has checked ``count <= len(b)`` (every varint is at least one byte), which bounds every
    allocation here by a small multiple of the received bytes.
    """
    if count > 0 and b.shape[0] <= SMALL_COUNT:
        return _small_varint_decode(b.tobytes(), count, n_blocks, peer)
    ends = np.flatnonzero(b < 0x80)
    if ends.shape[0] != count:
        raise _bad("number of varints disagrees with count", peer, limit=count, value=int(ends.shape[0]))
    if count == 0:
        if b.shape[0]:
            raise _bad("stream ends inside a varint", peer, value=int(b.shape[0]))
        return np.zeros(0, dtype=np.int64)
    if int(ends[-1]) != b.shape[0] - 1:
        raise _bad("stream ends inside a varint", peer, value=int(b.shape[0]))
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lens = ends - starts + 1
    maxlen = max_varint_len(n_blocks)
    longest = int(lens.max())
    if longest > maxlen:
        raise _bad("varint longer than any valid gap", peer, limit=maxlen, value=longest)
    vals = (b[starts] & 0x7F).astype(np.int64)
    for k in range(1, longest):
        m = lens > k
        vals[m] |= (b[starts[m] + k] & 0x7F).astype(np.int64) << (7 * k)
    # each gap < n_blocks <= 2**40: a prefix sum can wrap int64 only after ~2**23 maximal gaps, and a wrap
    # shows up as a decrease, which SparsePayload.validate (always run by the decoder) rejects
    if int(vals.max()) >= n_blocks:
        raise _bad("gap beyond the layer", peer, limit=n_blocks, value=int(vals.max()))
    vals += 1
    np.cumsum(vals, out=vals)
    vals -= 1
    if int(vals[-1]) >= n_blocks:
        raise _bad("index beyond the layer", peer, limit=n_blocks, value=int(vals[-1]))
    return vals


def bitmap_encode(indices: Int64Array, n_blocks: int) -> U8Array:
    """Bit ``i`` of byte ``i >> 3`` (LSB first) set for every index."""
    bits = np.zeros(n_blocks, dtype=bool)
    bits[indices] = True
    return np.packbits(bits, bitorder="little")


def bitmap_decode(b: U8Array, count: int, *, peer: str | None = None) -> Int64Array:
    """Positions of the set bits; exactly ``count`` of them or :class:`MalformedPayload`."""
    ones = int(np.bitwise_count(b).sum(dtype=np.int64))
    if ones != count:
        raise MalformedPayload("bitmap population disagrees with count", peer=peer, limit=count, value=ones)
    return np.flatnonzero(np.unpackbits(b, bitorder="little")).astype(np.int64, copy=False)


def cast_output(out: npt.NDArray[Any], values: npt.NDArray[Any], dtype: type[Any]) -> npt.NDArray[Any]:
    """A caller's output array for a 16-bit cast (a buffer it reuses, so that a large layer's cast does
    not fault in fresh pages every step), viewed as ``dtype``. Checked, because the compiled kernels write
    without bounds checks: a short, strided or read-only buffer is a :class:`KernelError`."""
    if out.dtype.itemsize != 2 or out.shape != values.shape or not out.flags.c_contiguous:
        raise KernelError("cast output must be a contiguous 16-bit array of the input's length")
    if not out.flags.writeable:
        raise KernelError("cast output is read-only")
    return out.view(dtype)


def f32_to_f16(
    values: npt.NDArray[np.float32], out: npt.NDArray[np.float16] | None = None
) -> tuple[npt.NDArray[np.float16], bool]:
    """Round-to-nearest-even fp32 -> fp16, chunked; second item True if a finite value became ±inf.
    ``out``: write into this array (the caller's reused buffer) instead of a new one."""
    out = np.empty(values.shape[0], dtype=np.float16) if out is None else cast_output(out, values, np.float16)
    for start in range(0, values.shape[0], _CHUNK):
        src = values[start : start + _CHUNK]
        dst = out[start : start + _CHUNK]
        with np.errstate(over="ignore"):
            np.copyto(dst, src, casting="unsafe")
        inf = np.isinf(dst)
        if inf.any() and bool(np.isfinite(src[inf]).any()):
            return out, True
    return out, False


def f32_to_bf16(values: npt.NDArray[np.float32], out: U16Array | None = None) -> U16Array:
    """Round-to-nearest-even fp32 -> bf16 bit patterns, chunked to keep temporaries in cache."""
    out = np.empty(values.shape[0], dtype=np.uint16) if out is None else cast_output(out, values, np.uint16)
    for start in range(0, values.shape[0], _CHUNK):
        out[start : start + _CHUNK] = fp32_to_bf16(values[start : start + _CHUNK])
    return out


class NumpyCodecKernels:
    """The functions above behind the interface the codec dispatches through (see ``kernel_choice``)."""

    name = "numpy"

    @staticmethod
    def gap_stats(indices: Int64Array, n_blocks: int) -> tuple[bool, int, int]:
        return gap_stats(indices, n_blocks)

    @staticmethod
    def varint_encode(indices: Int64Array, nbytes: int) -> U8Array:
        return varint_encode(indices, nbytes)

    @staticmethod
    def varint_decode(b: U8Array, count: int, n_blocks: int, *, peer: str | None = None) -> Int64Array:
        return varint_decode(b, count, n_blocks, peer=peer)

    @staticmethod
    def bitmap_encode(indices: Int64Array, n_blocks: int) -> U8Array:
        return bitmap_encode(indices, n_blocks)

    @staticmethod
    def bitmap_decode(b: U8Array, count: int, *, peer: str | None = None) -> Int64Array:
        return bitmap_decode(b, count, peer=peer)

    @staticmethod
    def f32_to_f16(
        values: npt.NDArray[np.float32], out: npt.NDArray[np.float16] | None = None
    ) -> tuple[npt.NDArray[np.float16], bool]:
        return f32_to_f16(values, out)

    @staticmethod
    def f32_to_bf16(values: npt.NDArray[np.float32], out: U16Array | None = None) -> U16Array:
        return f32_to_bf16(values, out)
