"""Wire encodings of the sorted block indices of a COO payload (NumPy reference path).

Why several: at the densities wanrt runs at, the index stream is the only part of a payload that the
format can shrink (the values are what they are), and which encoding is smallest depends on the density.
Gaps between selected blocks are small at the usual 1 % density, so delta + LEB128 varint wins there; when
more than about 1 block in 10 is selected a bitmap wins; raw uint32 is the fallback that is fastest to
decode. All four sizes are cheap to compute from the gaps, so the encoder just picks the smallest per
payload and names it in ``meta["index"]`` (measured sizes in ``docs/codec.md``).

Delta encodings store ``gap - 1`` (``d[0] = idx[0]``, ``d[i] = idx[i] - idx[i-1] - 1``): a strictly increasing
sequence is then the *only* thing the stream can express, so a peer cannot smuggle in a duplicate or an
unsorted index; prefix sums that wrap around int64 (possible only for adversarial gap streams of ~2**28
six-byte varints) show up as a decrease, which ``SparsePayload.validate`` rejects.

Every decoder checks the byte length against ``count`` before allocating, so the int64 index array it
returns is at most 8x (varint, bitmap: 64x bits) the bytes the peer actually sent.
"""

from __future__ import annotations

from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt

from wanrt.errors import MalformedPayload

__all__ = [
    "INDEX_ENCODINGS",
    "IndexEncoding",
    "choose_encoding",
    "decode_indices",
    "encode_indices",
    "encoded_sizes",
    "gaps_of",
    "varint_lengths",
]

IndexEncoding = Literal["u32", "d16", "varint", "bitmap"]

#: Known encodings in order of preference when two are equally small (fastest to decode first).
INDEX_ENCODINGS: Final[tuple[IndexEncoding, ...]] = ("u32", "d16", "varint", "bitmap")

_U32_LIMIT: Final = 1 << 32
_U16_LIMIT: Final = 1 << 16

Int64Array = npt.NDArray[np.int64]
ByteArray = npt.NDArray[Any]


def gaps_of(indices: Int64Array) -> Int64Array:
    """``gap - 1`` stream of strictly increasing indices (``d[0] = idx[0]``); all entries are ``>= 0``."""
    g = np.empty_like(indices)
    if indices.shape[0]:
        g[0] = indices[0]
        np.subtract(indices[1:], indices[:-1], out=g[1:])
        g[1:] -= 1
    return g


def varint_lengths(gaps: Int64Array) -> npt.NDArray[np.uint8]:
    """LEB128 byte length of each gap (1 byte per 7 bits)."""
    lens = np.ones(gaps.shape[0], dtype=np.uint8)
    if gaps.shape[0] == 0:
        return lens
    gmax = int(gaps.max())
    shift = 7
    while shift < 64 and gmax >= (1 << shift):
        lens += gaps >= (1 << shift)
        shift += 7
    return lens


def max_varint_len(n_blocks: int) -> int:
    """Longest varint a valid stream can hold: every gap is ``< n_blocks``."""
    return max(1, -(-max(n_blocks - 1, 0).bit_length() // 7))


def encoded_sizes(
    indices: Int64Array, n_blocks: int, gaps: Int64Array | None = None
) -> dict[IndexEncoding, int]:
    """Wire size in bytes of every encoding applicable to ``indices`` (sorted, unique, ``< n_blocks``)."""
    count = int(indices.shape[0])
    if gaps is None:
        gaps = gaps_of(indices)
    sizes: dict[IndexEncoding, int] = {}
    if n_blocks <= _U32_LIMIT:
        sizes["u32"] = 4 * count
    if count == 0 or int(gaps.max()) < _U16_LIMIT:
        sizes["d16"] = 2 * count
    sizes["varint"] = int(varint_lengths(gaps).sum(dtype=np.int64))
    sizes["bitmap"] = (n_blocks + 7) // 8
    return sizes


def choose_encoding(indices: Int64Array, n_blocks: int, gaps: Int64Array | None = None) -> IndexEncoding:
    """The smallest applicable encoding; ties go to the one fastest to decode."""
    sizes = encoded_sizes(indices, n_blocks, gaps)
    return min(sizes, key=lambda e: (sizes[e], INDEX_ENCODINGS.index(e)))


def encode_indices(
    indices: Int64Array, n_blocks: int, encoding: IndexEncoding, gaps: Int64Array | None = None
) -> ByteArray:
    """Encode valid indices; the returned contiguous array's raw bytes are the wire form (little-endian).

    Raises ``ValueError`` when ``encoding`` cannot represent these indices (the caller checked
    :func:`encoded_sizes` or asked for it explicitly).
    """
    if encoding == "u32":
        if n_blocks > _U32_LIMIT:
            raise ValueError("u32 index encoding needs fewer than 2**32 blocks")
        return indices.astype("<u4")
    if encoding == "bitmap":
        bits = np.zeros(n_blocks, dtype=bool)
        bits[indices] = True
        return np.packbits(bits, bitorder="little")
    if gaps is None:
        gaps = gaps_of(indices)
    if encoding == "d16":
        if gaps.shape[0] and int(gaps.max()) >= _U16_LIMIT:
            raise ValueError("a gap does not fit the d16 index encoding")
        return gaps.astype("<u2")
    if encoding == "varint":
        return _varint_encode(gaps)
    raise ValueError(f"unknown index encoding {encoding!r}")


def _varint_encode(gaps: Int64Array) -> npt.NDArray[np.uint8]:
    """Vectorised LEB128: one masked pass per byte position (at most ``max_varint_len`` passes)."""
    lens = varint_lengths(gaps)
    n = gaps.shape[0]
    if n == 0:
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


def _bad(msg: str, peer: str | None, **fields: Any) -> MalformedPayload:
    return MalformedPayload(f"index stream: {msg}", peer=peer, **fields)


def _expect_len(buf: memoryview, want: int, encoding: str, peer: str | None) -> None:
    if len(buf) != want:
        raise _bad(f"{encoding} buffer length disagrees with count", peer, limit=want, value=len(buf))


def _prefix_sum_gaps(g: Int64Array) -> Int64Array:
    """Invert :func:`gaps_of` in place: ``idx = cumsum(d + 1) - 1`` (int64; a wrap is caught by validate)."""
    g += 1
    np.cumsum(g, out=g)
    g -= 1
    return g


def decode_indices(
    buf: memoryview, count: int, n_blocks: int, encoding: str, *, peer: str | None = None
) -> Int64Array:
    """Decode ``count`` block indices; raises :class:`MalformedPayload` on any inconsistency.

    ``buf`` is a byte-format memoryview. Range and strict monotonicity of the result are checked by the
    caller (``SparsePayload.validate``); this function guarantees the byte stream is exactly consumed.
    """
    if encoding == "u32":
        _expect_len(buf, 4 * count, encoding, peer)
        return np.frombuffer(buf, dtype="<u4").astype(np.int64)
    if encoding == "d16":
        _expect_len(buf, 2 * count, encoding, peer)
        return _prefix_sum_gaps(np.frombuffer(buf, dtype="<u2").astype(np.int64))
    if encoding == "varint":
        return _prefix_sum_gaps(varint_decode_gaps(buf, count, n_blocks, peer=peer))
    if encoding == "bitmap":
        return _bitmap_decode(buf, count, n_blocks, peer)
    raise _bad("unknown index encoding", peer, value=encoding)


def varint_decode_gaps(buf: memoryview, count: int, n_blocks: int, *, peer: str | None = None) -> Int64Array:
    """Vectorised LEB128 decode of exactly ``count`` gaps filling ``buf`` exactly, each ``< n_blocks``."""
    if count > len(buf):  # every varint is at least one byte: refuse before scanning or allocating
        raise _bad("varint stream shorter than count", peer, limit=len(buf), value=count)
    b = np.frombuffer(buf, dtype=np.uint8)
    ends = np.flatnonzero(b < 0x80)
    if ends.shape[0] != count:
        raise _bad("varint count disagrees with meta", peer, limit=count, value=int(ends.shape[0]))
    if count == 0:
        if b.shape[0]:
            raise _bad("varint stream ends inside a varint", peer, value=int(b.shape[0]))
        return np.zeros(0, dtype=np.int64)
    if int(ends[-1]) != b.shape[0] - 1:
        raise _bad("varint stream ends inside a varint", peer, value=int(b.shape[0]))
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
    if int(vals.max()) >= max(n_blocks, 1):
        raise _bad("varint gap beyond the layer", peer, limit=n_blocks, value=int(vals.max()))
    return vals


def _bitmap_decode(buf: memoryview, count: int, n_blocks: int, peer: str | None) -> Int64Array:
    _expect_len(buf, (n_blocks + 7) // 8, "bitmap", peer)
    b = np.frombuffer(buf, dtype=np.uint8)
    ones = int(np.bitwise_count(b).sum(dtype=np.int64)) if b.shape[0] else 0
    if ones != count:
        raise _bad("bitmap population disagrees with count", peer, limit=count, value=ones)
    if n_blocks % 8 and int(b[-1]) >> (n_blocks % 8):
        raise _bad("bitmap has bits set beyond the layer", peer, limit=n_blocks)
    return np.flatnonzero(np.unpackbits(b, bitorder="little")).astype(np.int64, copy=False)
