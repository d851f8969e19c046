"""Rice coding of block-index gaps, in two streams so that NumPy encodes and decodes it without a loop.

Why: with low-bit values the index is a fifth of the payload (int2 at 1 %: 0.08 of 0.39 bytes per element),
and varint spends 10.2 bits per gap where the entropy bound of the positions at density d is
``H(d)/d`` ≈ log2(1/d) + 1.44 bits (8.1 at 1 %). A Rice code with parameter ``k`` (Golomb 1966, Rice 1979:
the Golomb code for a power-of-two divisor, optimal for geometric gaps up to ~0.03 bits) spends
``k + 1 + (g >> k)`` bits on gap ``g``; with ``k`` ≈ log2(mean gap · ln 2) that is within ~3 % of the bound.

Layout (little-endian bit order inside every byte)::

    byte 0             k (0..40)
    ceil(n*k/8) bytes  the n remainders g & (2**k - 1), k bits each; unused bits of the last byte zero
    the rest           the n quotients g >> k in unary: q zeros, then a one; the last byte holds the
                       last one (no trailing zero byte), its bits above it zero

Splitting the fixed-width remainders from the unary quotients is what makes both directions vectorised:
the quotients are the distances between consecutive ones of the unary stream (``np.flatnonzero``), the
remainders a reshape. The stream can only express strictly increasing indices, like ``varint``.
"""

from __future__ import annotations

import math
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from wanrt.errors import MalformedPayload

__all__ = ["MAX_RICE_K", "rice_decode", "rice_encode", "rice_k", "rice_size_bound"]

#: Largest parameter: gaps are below 2**40 (``MAX_DENSE_LEN``), so larger k never helps.
MAX_RICE_K: Final = 40


def rice_k(count: int, gap_sum: int) -> int:
    """The parameter for ``count`` gaps summing to ``gap_sum`` (O(1): ``gap_sum = last + 1 - count``): the
    better of the two integers around log2(mean · ln 2) by :func:`rice_size_bound`."""
    if count == 0 or gap_sum <= 0:
        return 0
    base = max(0, min(MAX_RICE_K, math.floor(math.log2(gap_sum / count * math.log(2)))))
    cands = {base, min(base + 1, MAX_RICE_K)}
    return min(cands, key=lambda k: (rice_size_bound(count, gap_sum, k), k))


def rice_size_bound(count: int, gap_sum: int, k: int) -> int:
    """Bytes of the stream at most (exact when every gap's quotient is exact: sum of floors <= floor of
    the sum): what the encoder compares with the other encodings' exact sizes."""
    return 1 + -(-count * k // 8) + -(-(count + (gap_sum >> k)) // 8)


def rice_encode(indices: npt.NDArray[np.int64], k: int) -> npt.NDArray[np.uint8]:
    """The stream for valid (strictly increasing, non-negative) indices."""
    n = int(indices.shape[0])
    gaps = np.diff(indices, prepend=-1) - 1
    rem = gaps & ((1 << k) - 1)
    q = gaps >> k
    if k and n:
        lanes = ((rem[:, None] >> np.arange(k, dtype=np.int64)) & 1).astype(np.uint8)
        rem_bytes = np.packbits(lanes.reshape(-1), bitorder="little")
    else:
        rem_bytes = np.zeros(0, np.uint8)
    if n:
        ones = np.cumsum(q + 1) - 1
        bits = np.zeros(int(ones[-1]) + 1, np.uint8)
        bits[ones] = 1
        unary = np.packbits(bits, bitorder="little")
    else:
        unary = np.zeros(0, np.uint8)
    return np.concatenate([np.array([k], np.uint8), rem_bytes, unary])


def _bad(msg: str, peer: str | None, **fields: Any) -> MalformedPayload:
    return MalformedPayload(f"index stream: rice {msg}", peer=peer, **fields)


def rice_decode(
    buf: memoryview, count: int, n_blocks: int, *, peer: str | None = None
) -> npt.NDArray[np.int64]:
    """``count`` indices from the stream; :class:`MalformedPayload` unless it is exactly one canonical
    stream of ``count`` gaps inside ``n_blocks``. Allocations are at most 8x the bytes of ``buf``."""
    raw = np.frombuffer(buf, dtype=np.uint8)
    if raw.shape[0] < 1:
        raise _bad("stream has no parameter byte", peer)
    k = int(raw[0])
    if k > MAX_RICE_K:
        raise _bad("parameter out of range", peer, limit=MAX_RICE_K, value=k)
    rem_len = -(-count * k // 8)
    if count > 8 * (raw.shape[0] - 1 - rem_len):  # every gap needs one unary bit: refuse before unpacking
        raise _bad("stream shorter than count", peer, limit=raw.shape[0], value=count)
    if count == 0:
        if raw.shape[0] != 1:
            raise _bad("bytes after an empty stream", peer, value=raw.shape[0])
        return np.zeros(0, np.int64)
    unary = raw[1 + rem_len :]
    ones = np.flatnonzero(np.unpackbits(unary, bitorder="little"))
    if ones.shape[0] != count:
        raise _bad("unary stream disagrees with count", peer, limit=count, value=int(ones.shape[0]))
    if int(ones[-1]) // 8 != unary.shape[0] - 1:
        raise _bad("bytes after the last gap", peer, value=unary.shape[0])
    q = np.diff(ones, prepend=-1) - 1
    if k:
        lanes = np.unpackbits(raw[1 : 1 + rem_len], bitorder="little")
        if np.any(lanes[count * k :]):
            raise _bad("bits set beyond the last remainder", peer)
        weights = (np.int64(1) << np.arange(k, dtype=np.int64))[None, :]
        rem = (lanes[: count * k].reshape(count, k).astype(np.int64) * weights).sum(axis=1)
    else:
        rem = np.zeros(count, np.int64)
    if int(q.max()) > max(n_blocks - 1, 0) >> k:  # a gap's quotient alone past the layer: no overflow below
        raise _bad("gap beyond the layer", peer, limit=n_blocks)
    gaps = (q << k) | rem
    if float(gaps.sum(dtype=np.float64)) + count > float(n_blocks) * (1 + 1e-9) + 1:
        raise _bad("indices beyond the layer", peer, limit=n_blocks)
    out = np.cumsum(gaps + 1)  # no overflow: the float sum above bounds it by ~n_blocks <= 2**40
    out -= 1
    if int(out[-1]) >= n_blocks:
        raise _bad("indices beyond the layer", peer, limit=n_blocks, value=int(out[-1]))
    return out
