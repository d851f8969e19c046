"""Wire encodings of the sorted block indices of a COO payload, and how the encoder picks one.

Why several: the values are what they are, so the index stream is the only part of a payload the format
can shrink, and which encoding is smallest depends on the density. At the usual 1 % density the gaps
between selected blocks are small and delta + LEB128 varint wins (1.27 bytes per block at block-16, 1.28
per element element-wise, against 4 for raw uint32); d16 (2 bytes) wins when the gaps are all in
[128, 65536); above about 1 selected block in 8 a bitmap wins. ``run`` is one contiguous range of blocks
(a dense layer, or a piece of one cut by the all-pairs cut-through): 8 bytes, the first index. The sizes
follow from one pass over the indices (:meth:`CodecKernels.gap_stats`), so the encoder picks the smallest
per payload and names it in ``meta["index"]``. Measured sizes and speeds: ``docs/codec.md``.

Delta encodings store ``gap = idx[i] - idx[i-1] - 1`` (``idx[-1] = -1``): a strictly increasing sequence is
then the only thing the stream can express, so a peer cannot smuggle in a duplicate or unsorted index.
Every decoder checks the byte length against ``count`` before allocating, so the int64 array it returns is
at most 8x (bitmap: 64x) the bytes the peer actually sent.
"""

from __future__ import annotations

from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt

from wanrt.codec.kernel_choice import CodecKernels
from wanrt.codec.reference_kernels import gaps_of
from wanrt.codec.rice_index import rice_decode, rice_encode, rice_k, rice_size_bound
from wanrt.errors import MalformedPayload

__all__ = [
    "DEFAULT_CHOICES",
    "INDEX_ENCODINGS",
    "IndexEncoding",
    "choose_encoding",
    "decode_indices",
    "encode_indices",
    "encoded_sizes",
    "encoded_sizes_of",
    "gap_sum_of",
    "is_run",
]

IndexEncoding = Literal["run", "u32", "d16", "varint", "bitmap", "rice"]

#: Known encodings in order of preference when two are equally small (fastest to decode first).
INDEX_ENCODINGS: Final[tuple[IndexEncoding, ...]] = ("run", "u32", "d16", "varint", "bitmap", "rice")
#: Encodings the encoder picks by itself for every payload; ``rice`` only for low-bit values, where the
#: index is a fifth of the payload (``rice_index``), or when asked for.
DEFAULT_CHOICES: Final[tuple[IndexEncoding, ...]] = ("run", "u32", "d16", "varint", "bitmap")

_U32_LIMIT: Final = 1 << 32
_U16_LIMIT: Final = 1 << 16

Int64Array = npt.NDArray[np.int64]


def encoded_sizes(
    count: int,
    n_blocks: int,
    max_gap: int,
    varint_bytes: int,
    contiguous: bool = False,
    gap_sum: int = 0,
) -> dict[IndexEncoding, int]:
    """Wire size in bytes of every encoding able to hold ``count`` valid indices with these gap stats
    (``contiguous``: they are one run ``first .. first + count - 1``; ``gap_sum``: ``last + 1 - count``;
    the ``rice`` size is an upper bound, the others exact)."""
    sizes: dict[IndexEncoding, int] = {}
    if contiguous:
        sizes["run"] = 8
    if n_blocks <= _U32_LIMIT:
        sizes["u32"] = 4 * count
    if max_gap < _U16_LIMIT:
        sizes["d16"] = 2 * count
    sizes["varint"] = varint_bytes
    sizes["bitmap"] = (n_blocks + 7) // 8
    sizes["rice"] = rice_size_bound(count, gap_sum, rice_k(count, gap_sum))
    return sizes


def encoded_sizes_of(indices: Int64Array, n_blocks: int, kernels: CodecKernels) -> dict[IndexEncoding, int]:
    """:func:`encoded_sizes` straight from valid indices (one pass); ValueError if they are not valid."""
    ok, max_gap, varint_bytes = kernels.gap_stats(indices, n_blocks)
    if not ok:
        raise ValueError("indices are not strictly increasing inside the layer")
    n = int(indices.shape[0])
    return encoded_sizes(n, n_blocks, max_gap, varint_bytes, is_run(indices), gap_sum_of(indices))


def gap_sum_of(indices: Int64Array) -> int:
    """Sum of the gaps of valid indices, O(1): ``last + 1 - count``."""
    n = int(indices.shape[0])
    return int(indices[-1]) + 1 - n if n else 0


def is_run(indices: Int64Array) -> bool:
    """Valid (strictly increasing) indices that form one contiguous (maybe empty) range: O(1)."""
    n = int(indices.shape[0])
    return n == 0 or int(indices[-1]) - int(indices[0]) == n - 1


def choose_encoding(
    sizes: dict[IndexEncoding, int], allowed: tuple[IndexEncoding, ...] = DEFAULT_CHOICES
) -> IndexEncoding:
    """The smallest of the ``allowed`` encodings; ties go to the one fastest to decode."""
    return min((e for e in sizes if e in allowed), key=lambda e: (sizes[e], INDEX_ENCODINGS.index(e)))


def encode_indices(
    indices: Int64Array,
    n_blocks: int,
    encoding: IndexEncoding,
    kernels: CodecKernels,
    sizes: dict[IndexEncoding, int],
) -> npt.NDArray[Any]:
    """Encode valid indices; ``sizes`` from :func:`encoded_sizes` (the caller checked ``encoding`` is in it).

    The returned contiguous array's raw bytes are the wire form (little-endian).
    """
    if encoding == "run":
        return np.array([indices[0] if indices.shape[0] else 0], dtype="<i8")
    if encoding == "u32":
        return indices.astype("<u4")
    if encoding == "d16":
        return gaps_of(indices).astype("<u2")
    if encoding == "varint":
        return kernels.varint_encode(indices, sizes["varint"])
    if encoding == "rice":
        return rice_encode(indices, rice_k(int(indices.shape[0]), gap_sum_of(indices)))
    return kernels.bitmap_encode(indices, n_blocks)


def _bad(msg: str, peer: str | None, **fields: Any) -> MalformedPayload:
    return MalformedPayload(f"index stream: {msg}", peer=peer, **fields)


def _expect_len(buf: memoryview, want: int, encoding: str, peer: str | None) -> None:
    if len(buf) != want:
        raise _bad(f"{encoding} buffer length disagrees with count", peer, limit=want, value=len(buf))


def decode_indices(
    buf: memoryview,
    count: int,
    n_blocks: int,
    encoding: str,
    kernels: CodecKernels,
    *,
    peer: str | None = None,
) -> Int64Array:
    """Decode ``count`` block indices from the byte view ``buf``; :class:`MalformedPayload` if inconsistent.

    Guarantees the stream is consumed exactly; range and strict monotonicity of the result are checked by
    the caller (``SparsePayload.validate``) for every encoding alike.
    """
    if encoding == "run":
        _expect_len(buf, 8, encoding, peer)
        first = int(np.frombuffer(buf, dtype="<i8")[0])
        if first < 0 or first + count > n_blocks:  # count <= n_blocks: checked by the caller
            raise _bad("run outside the layer", peer, limit=n_blocks, value=first)
        return np.arange(first, first + count, dtype=np.int64)
    if encoding == "u32":
        _expect_len(buf, 4 * count, encoding, peer)
        return np.frombuffer(buf, dtype="<u4").astype(np.int64)
    if encoding == "d16":
        _expect_len(buf, 2 * count, encoding, peer)
        g = np.frombuffer(buf, dtype="<u2").astype(np.int64)
        g += 1
        np.cumsum(g, out=g)  # < 2**16 * 2**28: no overflow
        g -= 1
        return g
    if encoding == "varint":
        if count > len(buf):  # every varint is at least one byte: refuse before scanning or allocating
            raise _bad("varint stream shorter than count", peer, limit=len(buf), value=count)
        return kernels.varint_decode(np.frombuffer(buf, dtype=np.uint8), count, n_blocks, peer=peer)
    if encoding == "bitmap":
        _expect_len(buf, (n_blocks + 7) // 8, "bitmap", peer)
        b = np.frombuffer(buf, dtype=np.uint8)
        if n_blocks % 8 and int(b[-1]) >> (n_blocks % 8):
            raise _bad("bitmap has bits set beyond the layer", peer, limit=n_blocks)
        return kernels.bitmap_decode(b, count, peer=peer)
    if encoding == "rice":
        return rice_decode(buf, count, n_blocks, peer=peer)
    raise _bad("unknown index encoding", peer, value=encoding)
