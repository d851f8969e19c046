"""Low-bit value codings: int8, int4 and int2 codes with one 8-bit scale per group of values.

Why: at 1 % density the block index already costs only ~0.08 bytes per selected element (varint over
16-value blocks, ``index_encodings``), so the values are what is left to shrink (issue 23; SparseLoCo
sends 2-bit values, INTELLECT-1 int8). A value of ``b`` bits plus one scale byte per ``scale_block``
values costs ``b/8 + 1/scale_block`` bytes: at ``scale_block = 16`` int8 1.0625, int4 0.5625, int2 0.3125,
plus the index (``docs/codec.md``, "Low-bit values").

Quantiser (per group of ``scale_block`` consecutive values ``x``; a mid-rise uniform quantiser, so 2 bits
give four useful levels ``±0.5 s, ±1.5 s`` instead of ternary's three)::

    L = 2**(b-1) - 0.5                      # the largest level, in units of the step s
    s = 2**(E - k/8)  >= max|x| / L         # k in 0..254 the smallest such; k = 255: the group is zero
    c = clip(floor(x / s), -2**(b-1), 2**(b-1) - 1)
    y = (c + 0.5) * s                       # what the receiver gets, |x - y| <= s/2

``E`` is one int per payload (the exponent of the largest group's step), ``k`` one byte per group. The step
grid (2**(1/8) apart, 31.75 octaves below the largest group) is built from eight hard-coded fp32 constants
and ``ldexp``, and ``y`` is one IEEE fp32 multiply, so every machine dequantises to the same bits (sites
must hold bit-identical parameters; a libm ``pow`` may differ in the last place between hosts).

The quantisation error is the caller's to keep: the trainer's layer compressor quantises right after
selection and adds ``x - y`` to its error-feedback residual, so nothing is lost, only delayed (the same
invariant as sparsification; StellaTrain §3.2, SparseLoCo's EF over 2-bit values). To make what was sent
exactly what the residual accounts for, :func:`quantise_payload` returns the dequantised fp32 payload with
its codes attached (``SparsePayload.coded``); the codec sends those codes rather than quantising again.

Wire form of the values buffer (little-endian): an 8-byte header ``int32 E, uint16 scale_block, uint16 0``,
then ``ceil(n / scale_block)`` scale bytes ``k``, then the codes ``c + 2**(b-1)`` packed LSB first (two per
byte for int4, four for int2; the unused bits of the last byte zero). Sans-IO, NumPy only.
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt

from wanrt.errors import MalformedPayload
from wanrt.payload import SparsePayload, n_blocks

__all__ = [
    "CODING_BITS",
    "DEFAULT_SCALE_BLOCK",
    "HEADER_BYTES",
    "MAX_SCALE_BLOCK",
    "VALUE_CODINGS",
    "LowbitValues",
    "ValueCoding",
    "coded_size",
    "dequantise",
    "pack",
    "quantise",
    "quantise_payload",
    "unpack",
    "usable_coded",
]

ValueCoding = Literal["int8", "int4", "int2"]

#: Known low-bit codings, as named in ``meta["dtype"]`` and in the handshake.
VALUE_CODINGS: Final[tuple[ValueCoding, ...]] = ("int8", "int4", "int2")
CODING_BITS: Final[dict[str, int]] = {"int8": 8, "int4": 4, "int2": 2}

#: Values per scale byte unless configured (``ClientConfig.scale_block``): one cache-line block of 16.
DEFAULT_SCALE_BLOCK: Final = 16
#: Largest group one scale may cover (the same bound as the payload block size).
MAX_SCALE_BLOCK: Final = 4096

HEADER_BYTES: Final = 8
_HEADER: Final = struct.Struct("<iHH")

#: Scale code of a group sent as zeros (all its values are 0, or too small for the step grid).
ZERO_GROUP: Final = 255
#: Step-grid resolution: 2**(1/8) between neighbouring scales (at most 0.125 bits of resolution lost).
_GRID: Final = 8
#: 2**(-j/8) for j = 0..7, correctly rounded to fp32 (hard-coded bits: no libm on the decode path).
_FRAC: Final = np.array(
    [0x3F800000, 0x3F6AC0C7, 0x3F5744FD, 0x3F45672A, 0x3F3504F3, 0x3F25FED7, 0x3F1837F0, 0x3F0B95C2],
    dtype=np.uint32,
).view(np.float32)

#: Bounds of the payload exponent ``E``: steps between 2**-160 (below fp32's smallest subnormal) and
#: 2**110; larger values are refused by :func:`quantise` (sent in fp32 instead) so ``y`` never overflows.
MIN_EXPONENT: Final = -160
MAX_EXPONENT: Final = 110
_LARGEST: Final = 2.0**100
#: values per chunk of the quantiser's float64 scratch (64 KiB: stays in cache, reused by malloc)
_CHUNK: Final = 8192


@dataclass(frozen=True, slots=True, eq=False)
class LowbitValues:
    """The exact wire form of a run of values: codes, per-group scale codes and the payload exponent.

    ``values`` is the fp32 array these decode to (:func:`dequantise`) when it is known: the codec sends
    these codes for a payload only while ``payload.values is coded.values`` (see :func:`usable_coded`), so a
    payload rebuilt with other values is never sent with stale codes.
    """

    coding: str
    scale_block: int
    exponent: int
    scales: npt.NDArray[np.uint8]
    codes: npt.NDArray[np.int8]
    values: npt.NDArray[np.float32] | None = None

    @property
    def bits(self) -> int:
        return CODING_BITS[self.coding]


def coded_size(n: int, coding: str, scale_block: int) -> int:
    """Bytes of the values buffer for ``n`` values."""
    return HEADER_BYTES + -(-n // scale_block) + -(-n * CODING_BITS[coding] // 8)


def _steps(exponent: int, scales: npt.NDArray[np.uint8]) -> npt.NDArray[np.float32]:
    """fp32 step per group: ``2**(E - k/8)`` exactly as every host computes it; 0 for zero groups."""
    k = scales.astype(np.int32)
    s = np.ldexp(_FRAC[k % _GRID], (exponent - k // _GRID).astype(np.int32))
    s[scales == ZERO_GROUP] = 0
    return s.astype(np.float32, copy=False)


def _grid(exponent: int, k: npt.NDArray[np.int32]) -> npt.NDArray[np.float64]:
    """The grid step of code ``k`` (0..255, 255 included as if it were a step), as float64."""
    return np.ldexp(_FRAC[k % _GRID], (exponent - k // _GRID).astype(np.int32)).astype(np.float64)


def _group_absmax(grouped: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """max |x| per row, by halving the row width (NumPy's reduction along a short last axis is ~2x
    slower); NaN propagates like ``max`` (np.maximum)."""
    a = np.abs(grouped)
    w = a.shape[1]
    while w > 1:
        h = w // 2
        if w % 2:
            np.maximum(a[:, :1], a[:, w - 1 : w], out=a[:, :1])
        np.maximum(a[:, :h], a[:, h : 2 * h], out=a[:, :h])
        w = h
    return a[:, 0]


def _grouped(x: npt.NDArray[np.float32], scale_block: int) -> npt.NDArray[np.float32]:
    """``x`` as (groups, scale_block), the last group zero-padded (a copy only when padding is needed)."""
    g = -(-x.shape[0] // scale_block)
    if g * scale_block == x.shape[0]:
        return x.reshape(g, scale_block)
    out = np.zeros(g * scale_block, np.float32)
    out[: x.shape[0]] = x
    return out.reshape(g, scale_block)


def quantise(x: npt.NDArray[np.float32], coding: str, scale_block: int) -> LowbitValues | None:
    """Codes for the fp32 values ``x`` (module docstring); None when a value is not finite or |x| > 2**100
    (the caller then sends fp32, the same fall-back as an fp16 overflow: nothing is clamped)."""
    bits = CODING_BITS[coding]
    n = int(x.shape[0])
    x = np.ascontiguousarray(x, dtype=np.float32)
    grouped = _grouped(x, scale_block)
    m = _group_absmax(grouped).astype(np.float64) if n else np.zeros(0)
    if n and not (np.isfinite(m).all() and float(m.max()) <= _LARGEST):
        return None
    top = 2.0 ** (bits - 1) - 0.5  # L
    need = m / top  # the smallest step that holds each group without clipping
    biggest = float(need.max()) if n else 0.0
    if biggest > 0:
        mant, e = np.frexp(biggest)
        exponent = int(e) if mant > 0.5 else int(e) - 1  # ceil(log2(biggest)): 2**E >= every need
    else:
        exponent = 0
    exponent = max(exponent, MIN_EXPONENT)
    with np.errstate(divide="ignore"):
        k = np.floor(_GRID * (exponent - np.log2(need)))
    k = np.clip(np.nan_to_num(k, nan=ZERO_GROUP, posinf=ZERO_GROUP), 0, ZERO_GROUP).astype(np.int32)
    # log2 is rounded: make k exactly the largest code whose fp32 step still holds the group (255 = none
    # of the real steps is needed: a zero group), by comparing against the very steps the decoder uses
    k[(_grid(exponent, k) < need) & (k > 0)] -= 1
    up = np.minimum(k + 1, ZERO_GROUP)
    k[(k < ZERO_GROUP) & (_grid(exponent, up) >= need)] += 1
    k[need == 0] = ZERO_GROUP
    scales = k.astype(np.uint8)
    steps = _steps(exponent, scales)
    lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    safe = np.where(steps > 0, steps, np.float32(1)).astype(np.float64)[:, None]
    codes = np.empty(grouped.shape, np.int8)
    # c = floor(x / s) in float64 (exact operands, one correctly rounded division), chunk by chunk through
    # one cache-sized scratch: a layer-sized float64 temporary is fresh memory to fault in, 10x the work
    rows = max(1, _CHUNK // scale_block)
    scratch = np.empty((min(rows, grouped.shape[0]), scale_block), np.float64)
    for a in range(0, grouped.shape[0], rows):
        part = grouped[a : a + rows]
        buf = scratch[: part.shape[0]]
        np.divide(part, safe[a : a + rows], out=buf)
        np.floor(buf, out=buf)
        np.clip(buf, lo, hi, out=buf)
        np.copyto(codes[a : a + rows], buf, casting="unsafe")
    codes[scales == ZERO_GROUP] = 0
    return LowbitValues(coding, scale_block, exponent, scales, np.ascontiguousarray(codes.reshape(-1)[:n]))


def dequantise(lv: LowbitValues) -> npt.NDArray[np.float32]:
    """``(c + 0.5) * s`` per value in fp32 (one rounding, identical on every host); zero groups give 0."""
    n = int(lv.codes.shape[0])
    steps = _steps(lv.exponent, lv.scales)
    per_value = np.repeat(steps, lv.scale_block)[:n]
    out = lv.codes.astype(np.float32)
    out += np.float32(0.5)
    out *= per_value
    return out


def pack(lv: LowbitValues) -> npt.NDArray[np.uint8]:
    """The values buffer (module docstring) as one contiguous uint8 array."""
    bits = lv.bits
    n = int(lv.codes.shape[0])
    header = np.frombuffer(_HEADER.pack(lv.exponent, lv.scale_block, 0), dtype=np.uint8)
    u = (lv.codes.astype(np.int16) + (1 << (bits - 1))).astype(np.uint8)
    per = 8 // bits
    if per > 1:
        padded = np.zeros(-(-n // per) * per, np.uint8)
        padded[:n] = u
        lanes = padded.reshape(-1, per)
        u = np.zeros(lanes.shape[0], np.uint8)
        for j in range(per):
            u |= lanes[:, j] << np.uint8(j * bits)
    return np.concatenate([header, lv.scales, u])


def _bad(msg: str, peer: str | None, **fields: Any) -> MalformedPayload:
    return MalformedPayload(f"low-bit values: {msg}", peer=peer, **fields)


def unpack(buf: memoryview, coding: str, n: int, *, peer: str | None = None) -> LowbitValues:
    """Parse a values buffer of ``n`` values; :class:`MalformedPayload` for anything inconsistent.

    The header is read first and its scale block bounded; the buffer length must then be exactly
    :func:`coded_size` before anything is allocated (the allocations are then at most ~20x its bytes).
    """
    bits = CODING_BITS[coding]
    if len(buf) < HEADER_BYTES:
        raise _bad("buffer shorter than its header", peer, limit=HEADER_BYTES, value=len(buf))
    exponent, scale_block, reserved = _HEADER.unpack_from(buf, 0)
    if reserved != 0:
        raise _bad("reserved header field must be 0", peer, value=reserved)
    if not 1 <= scale_block <= MAX_SCALE_BLOCK:
        raise _bad("scale block out of range", peer, limit=MAX_SCALE_BLOCK, value=scale_block)
    if not MIN_EXPONENT <= exponent <= MAX_EXPONENT:
        raise _bad("exponent out of range", peer, limit=MAX_EXPONENT, value=exponent)
    want = coded_size(n, coding, scale_block)
    if len(buf) != want:
        raise _bad("buffer length disagrees with count", peer, limit=want, value=len(buf))
    raw = np.frombuffer(buf, dtype=np.uint8)
    g = -(-n // scale_block)
    scales = raw[HEADER_BYTES : HEADER_BYTES + g].copy()
    packed = raw[HEADER_BYTES + g :]
    per = 8 // bits
    if per == 1:
        u = packed
    else:
        mask = np.uint8((1 << bits) - 1)
        lanes = np.empty((packed.shape[0], per), np.uint8)
        for j in range(per):
            np.bitwise_and(packed >> np.uint8(j * bits), mask, out=lanes[:, j])
        u = lanes.reshape(-1)
        if np.any(u[n:]):
            raise _bad("bits set beyond the last value", peer)
        u = u[:n]
    codes = (u.astype(np.int16) - (1 << (bits - 1))).astype(np.int8)
    return LowbitValues(coding, scale_block, exponent, scales, codes)


def _zero_padding(values: npt.NDArray[np.float32], dense_len: int, block_size: int, last: int) -> None:
    """Zero the positions beyond ``dense_len`` in a tail block (a payload invariant; a mid-rise quantiser
    has no zero level, so the codes there decode to ±s/2 and are overridden on both sides alike)."""
    tail = dense_len % block_size
    if tail and last == n_blocks(dense_len, block_size) - 1:
        values[values.shape[0] - block_size + tail :] = 0


def payload_values(p: SparsePayload, lv: LowbitValues) -> npt.NDArray[np.float32]:
    """What ``lv`` decodes to as ``p``'s values (tail padding zero), read-only."""
    y = dequantise(lv)
    if p.nnz_blocks:
        _zero_padding(y, p.dense_len, p.block_size, int(p.indices[-1]))
    y.flags.writeable = False
    return y


def quantise_payload(p: SparsePayload, coding: str, scale_block: int = DEFAULT_SCALE_BLOCK) -> SparsePayload:
    """``p`` as the receiver will see it after ``coding``: fp32 values ``y`` with the codes attached
    (``coded``), so the codec sends exactly ``y``. ``p`` itself when its values cannot be coded (not
    finite, or too large): it is then sent in its own dtype. The caller keeps ``p.values - y`` (error
    feedback) if it must not lose it."""
    lv = quantise(p.values_f32(), coding, scale_block)
    if lv is None:
        return p
    tmp = SparsePayload(p.layer, p.dense_len, p.block_size, p.indices, np.zeros(0, np.float32))
    y = payload_values(tmp, lv)
    coded = dataclasses.replace(lv, values=y)
    return SparsePayload(p.layer, p.dense_len, p.block_size, p.indices, y, "fp32", coded)


def usable_coded(p: SparsePayload) -> LowbitValues | None:
    """``p.coded`` when it still describes ``p.values`` exactly (same array object), else None."""
    c = p.coded
    if isinstance(c, LowbitValues) and c.values is not None and c.values is p.values:
        return c
    return None
