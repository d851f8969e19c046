"""Frame format: a fixed 24-byte struct header, a msgpack header map, then raw buffers appended out of band.

Why this shape (byte-by-byte layout in docs/protocol.md):

* The fixed header carries the two lengths first, so a receiver learns how much memory a frame needs from 24
  bytes and can refuse an oversized frame *before* buffering its body.
* The msgpack map holds only small field values; tensor data (a 100 MB gradient) is appended as raw buffers
  whose lengths are listed in the map under ``"_b"``. Sending is ``writelines([header, *buffers])`` with no
  copy into msgpack; receiving copies each byte once into one preallocated frame buffer and hands out views.
* Buffers start 8-byte aligned inside the frame (the ``pad`` field says how many zero bytes follow the
  msgpack map), so fp32/int64 values come out as aligned NumPy views.
* A CRC-32 (zlib) over header and body catches corruption that TCP's 16-bit checksum lets through (bad NICs,
  buggy middleboxes, memory errors) at ~2 GB/s, far cheaper than a cryptographic MAC. It is *not* a
  security mechanism: authenticity comes from the handshake and, on hostile paths, from TLS below us.

Everything here is sans-IO: bytes in, frames out.
"""

from __future__ import annotations

import itertools
import struct
import zlib
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, NamedTuple

import msgpack

from wanrt.errors import LimitExceeded, LocalProtocolError, RemoteProtocolError
from wanrt.protocol.limits import (
    BUFFER_ALIGNMENT,
    FIXED_HEADER_BYTES,
    MAX_BIN_BYTES,
    MAX_BUFFERS_PER_MESSAGE,
    MAX_FRAME_BYTES,
    MAX_HEADER_ARRAY_LEN,
    MAX_HEADER_BYTES,
    MAX_STR_CHARS,
)

__all__ = [
    "BUFFERS_KEY",
    "MAGIC",
    "FixedHeader",
    "FrameReader",
    "HeaderUnpacker",
    "RawFrame",
    "decode_frame_body",
    "encode_frame",
    "parse_fixed_header",
]

#: First four bytes of every frame: a receiver fails fast on a stray HTTP client or a desynchronised stream.
MAGIC: Final = b"WNRT"

#: magic, version, type, flags, pad, 3 reserved zero bytes, header_len, body_len, crc32 (network byte order).
_FIXED: Final = struct.Struct("!4sBBHB3sIII")
assert _FIXED.size == FIXED_HEADER_BYTES

#: Header-map key under which the buffer lengths travel; keys starting with "_" are reserved for framing.
BUFFERS_KEY: Final = "_b"

#: The fixed header without its CRC (what the CRC starts from), and the CRC alone.
_PREFIX: Final = struct.Struct("!4sBBHB3sII")
_CRC: Final = struct.Struct("!I")
assert _PREFIX.size + _CRC.size == _FIXED.size

#: One reused packer: ``msgpack.packb`` builds a new Packer per call, a third of framing a small header.
#: ``Packer.pack`` runs in C without releasing the GIL or calling back into Python for the plain types a
#: header holds, so sharing it is safe across threads.
_PACKER: Final = msgpack.Packer(use_bin_type=True)

_ZERO_RESERVED: Final = b"\x00\x00\x00"
_PADDING: Final = bytes(BUFFER_ALIGNMENT)


class FixedHeader(NamedTuple):
    version: int
    msg_type: int
    flags: int
    pad: int
    header_len: int
    body_len: int
    crc: int

    @property
    def frame_len(self) -> int:
        """Bytes of the whole frame, fixed header included."""
        return FIXED_HEADER_BYTES + self.header_len + self.pad + self.body_len

    @property
    def rest_len(self) -> int:
        """Bytes that follow the fixed header."""
        return self.header_len + self.pad + self.body_len


class RawFrame(NamedTuple):
    """A received frame whose checksum and header map have been verified but whose fields have not.

    A NamedTuple (immutable, like the frozen dataclass it was) because one is built per received frame
    and a frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``."""

    version: int
    msg_type: int
    flags: int
    header: dict[str, Any]
    buffers: list[memoryview]


def _byte_view(buf: Any) -> memoryview:
    view = memoryview(buf)
    if not view.c_contiguous:
        raise LocalProtocolError("out-of-band buffers must be C-contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


#: zlib.crc32 releases the GIL for buffers above 5 KiB; releasing and retaking it cost ~30 µs per call on
#: a busy machine (measured in the 1 000-site simulation: 36 µs for a 10 KiB buffer, 6 µs in 4 KiB slices),
#: several times the checksum itself. Buffers up to _CRC_SLICED_MAX are summed in slices below that bound
#: (same value: CRC-32 chains); larger ones, where the work dwarfs the GIL hand-off, go whole.
_CRC_SLICE: Final = 4096
_CRC_SLICED_MAX: Final = 256 * 1024


def _crc32(data: bytes | bytearray | memoryview, value: int) -> int:
    view = memoryview(data)
    n = view.nbytes
    if n <= _CRC_SLICE or n > _CRC_SLICED_MAX:
        return zlib.crc32(view, value)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    for i in range(0, n, _CRC_SLICE):
        value = zlib.crc32(view[i : i + _CRC_SLICE], value)
    return value


#: Read-only buffers of at least _CRC_CACHED_MIN bytes whose CRC-32 (from 0) is known, by identity: a
#: gateway frames one result for each of its children (the payload's buffers are the same objects each
#: time, ``payload_wire_form``), and checksumming 16 KiB eight times was a third of the sender's CRC work.
#: A buffer's CRC after any other start value follows from it by linearity (:func:`_advance`). ``bytes``
#: only (immutable), so that nothing can change the bytes behind a remembered CRC — not merely read-only
#: views, whose array may be written through another view. Bounded, cleared when full.
_CRC_CACHED_MIN: Final = 4096
_CRC_CACHE_MAX: Final = 64
_crc_cache: dict[int, tuple[Any, int]] = {}

#: Per buffer length n: four 256-entry tables of the linear map "run a CRC register through n zero bytes"
#: applied to each byte of the start value (so crc32(data, c) == crc32(data, 0) ^ _advance(c, n)).
_ADVANCE_MAX: Final = 16
_advance_tables: dict[int, tuple[list[int], ...]] = {}


def _advance(c: int, n: int) -> int:
    """``crc32(bytes(n), c) ^ crc32(bytes(n), 0)`` (zlib's pre- and post-inversion cancel out), which is
    linear in ``c``: four table lookups once the tables for ``n`` exist (32 CRCs of n zero bytes)."""
    tables = _advance_tables.get(n)
    if tables is None:
        zeros = bytes(n)
        base = zlib.crc32(zeros, 0)
        bit = [zlib.crc32(zeros, 1 << i) ^ base for i in range(32)]
        built = []
        for byte in range(4):
            t = [0] * 256
            for v in range(1, 256):
                low = v & -v  # t[v] = t[v without its lowest bit] ^ the map of that bit
                t[v] = t[v ^ low] ^ bit[8 * byte + low.bit_length() - 1]
            built.append(t)
        if len(_advance_tables) >= _ADVANCE_MAX:
            _advance_tables.clear()
        tables = _advance_tables[n] = tuple(built)
    t0, t1, t2, t3 = tables
    return t0[c & 0xFF] ^ t1[(c >> 8) & 0xFF] ^ t2[(c >> 16) & 0xFF] ^ t3[c >> 24]


def _crc32_of_buffer(view: memoryview, source: Any, value: int) -> int:
    """``_crc32(view, value)``, remembering the CRC of a large read-only ``source`` buffer."""
    if view.nbytes < _CRC_CACHED_MIN:
        return _crc32(view, value)
    # only immutable bytes: a read-only view of a writable array (a payload's values, a reused buffer)
    # can change behind a remembered CRC, and a stale CRC would make the peer end the link
    if type(source) is bytes:
        key: Any = source
    elif type(source) is memoryview and type(source.obj) is bytes and len(source.obj) == source.nbytes:
        key = source.obj  # a fresh view of the same bytes each time (a result's id set): the bytes count
    else:
        return _crc32(view, value)
    hit = _crc_cache.get(id(key))
    if hit is None or hit[0] is not key:
        if len(_crc_cache) >= _CRC_CACHE_MAX:
            _crc_cache.clear()
        hit = (key, _crc32(view, 0))
        _crc_cache[id(key)] = hit
    return hit[1] ^ _advance(value, view.nbytes)


def encode_frame(
    version: int,
    msg_type: int,
    header: Mapping[str, Any],
    buffers: Sequence[Any] = (),
    *,
    flags: int = 0,
    max_frame: int = MAX_FRAME_BYTES,
) -> list[memoryview]:
    """Frame one message as ``[fixed header + msgpack map + padding, *buffers]`` without copying buffers.

    Raises :class:`LocalProtocolError` when *we* are about to send something a conforming peer must refuse.
    """
    views = [_byte_view(b) for b in buffers] if buffers else []
    if len(views) > MAX_BUFFERS_PER_MESSAGE:
        raise LocalProtocolError("too many buffers in one frame", limit=MAX_BUFFERS_PER_MESSAGE)
    if BUFFERS_KEY in header:
        raise LocalProtocolError(f"header key {BUFFERS_KEY!r} is reserved for framing")
    fields = header
    body_len = 0
    if views:
        lengths = [v.nbytes for v in views]
        body_len = sum(lengths)
        fields = dict(header)
        fields[BUFFERS_KEY] = lengths
    try:
        packed = _PACKER.pack(fields)
    except (TypeError, ValueError, OverflowError) as exc:
        raise LocalProtocolError(f"header is not msgpack-serialisable: {exc}") from None
    header_len = len(packed)
    if header_len > MAX_HEADER_BYTES:
        raise LocalProtocolError("header map too large", limit=MAX_HEADER_BYTES, value=header_len)
    pad = -(FIXED_HEADER_BYTES + header_len) % BUFFER_ALIGNMENT
    total = FIXED_HEADER_BYTES + header_len + pad + body_len
    if total > max_frame:
        raise LocalProtocolError("frame larger than the frame limit", limit=max_frame, value=total)
    prefix = _PREFIX.pack(MAGIC, version, msg_type, flags, pad, _ZERO_RESERVED, header_len, body_len)
    padded = packed + _PADDING[:pad] if pad else packed
    crc = zlib.crc32(padded, zlib.crc32(prefix))
    for v, b in zip(views, buffers, strict=True):
        crc = zlib.crc32(v, crc) if v.nbytes <= _CRC_SLICE else _crc32_of_buffer(v, b, crc)
    head = b"".join((prefix, _CRC.pack(crc), padded))
    return [memoryview(head), *(v for v in views if v.nbytes)]


def parse_fixed_header(data: bytes | bytearray | memoryview, *, peer: str | None = None) -> FixedHeader:
    """Decode and sanity-check the 24 fixed bytes; type, version and size policy are the caller's."""
    return _checked_fixed(_FIXED.unpack(data), peer)


def _checked_fixed(fields: tuple[Any, ...], peer: str | None) -> FixedHeader:
    magic, version, msg_type, flags, pad, reserved, header_len, body_len, crc = fields
    if magic != MAGIC:
        raise RemoteProtocolError("bad magic: not a wanrt frame", peer=peer, value=bytes(magic))
    if version == 0:
        raise RemoteProtocolError("protocol version 0 does not exist", peer=peer)
    if reserved != _ZERO_RESERVED:
        raise RemoteProtocolError("reserved header bytes are not zero", peer=peer)
    if header_len == 0:
        raise RemoteProtocolError("empty header map", peer=peer)
    if header_len > MAX_HEADER_BYTES:
        raise LimitExceeded(
            "header map too large",
            name="MAX_HEADER_BYTES",
            limit=MAX_HEADER_BYTES,
            value=header_len,
            peer=peer,
        )
    if pad >= BUFFER_ALIGNMENT or (FIXED_HEADER_BYTES + header_len + pad) % BUFFER_ALIGNMENT:
        raise RemoteProtocolError("body is not 8-byte aligned", peer=peer, value=pad)
    return FixedHeader(version, msg_type, flags, pad, header_len, body_len, crc)


_UNPACK_LIMITS: Final[dict[str, int]] = {
    "max_str_len": 4 * MAX_STR_CHARS,  # UTF-8 needs at most 4 bytes per character
    "max_bin_len": MAX_BIN_BYTES,
    "max_array_len": MAX_HEADER_ARRAY_LEN,
    "max_map_len": MAX_HEADER_ARRAY_LEN,
    "max_ext_len": 0,
}


#: ``all(map(isinstance, keys, _STR))``: the header's key check without a generator frame per key.
_STR: Final = itertools.repeat(str)


class HeaderUnpacker:
    """``msgpack.unpackb`` with the header limits, for one reader: ``unpackb`` builds an unpacker per call
    and parses its keyword options each time (2.2 µs of a 2.7 µs Ack header); one reused ``Unpacker``
    with the same options and limits decodes it in 0.5 µs. Same results and the same refusals: input
    that is not exactly one object (cut short, or with bytes after it) raises, and after any error the
    unpacker is replaced, so nothing of a bad header lingers. Not shared between readers: feeding and
    unpacking are two calls. Only headers up to ``SMALL`` bytes go through it (every hot message's is far
    smaller), so its buffer stays a few KiB per connection; larger ones use ``unpackb``."""

    SMALL: Final = 2048

    __slots__ = ("_pos", "_u")

    def __init__(self) -> None:
        self._u = self._fresh()
        self._pos = 0  # bytes fed so far (Unpacker.tell() counts from its start)

    @staticmethod
    def _fresh() -> msgpack.Unpacker:
        return msgpack.Unpacker(
            use_list=False,
            raw=False,
            strict_map_key=True,
            max_buffer_size=2 * HeaderUnpacker.SMALL,
            read_size=HeaderUnpacker.SMALL,
            **_UNPACK_LIMITS,
        )

    def unpack(self, data: bytes | memoryview) -> Any:
        u = self._u
        try:
            u.feed(data)
            self._pos += len(data)
            obj = u.unpack()
            if u.tell() != self._pos:
                raise ValueError("extra data after the header map")
        except BaseException:
            self._u, self._pos = self._fresh(), 0
            raise
        return obj


def decode_frame_body(
    fixed: FixedHeader,
    fixed_bytes: bytes | memoryview,
    rest: bytearray | memoryview,
    *,
    peer: str | None = None,
    unpacker: HeaderUnpacker | None = None,
) -> RawFrame:
    """Verify checksum, header map and buffer lengths of a complete frame; buffers are views of ``rest``."""
    hl, pad = fixed.header_len, fixed.pad
    n = len(rest)
    if n != hl + pad + fixed.body_len:
        raise RemoteProtocolError("frame length disagrees with its header", peer=peer, value=n)
    crc = zlib.crc32(fixed_bytes[:-4])
    crc = zlib.crc32(rest, crc) if n <= _CRC_SLICE else _crc32(rest, crc)
    if crc != fixed.crc:
        raise RemoteProtocolError("frame checksum mismatch", peer=peer, value=crc, limit=fixed.crc)
    view = memoryview(rest)
    if pad and view[hl : hl + pad] != _PADDING[:pad]:
        raise RemoteProtocolError("nonzero padding after the header map", peer=peer)
    try:
        if unpacker is not None and hl <= HeaderUnpacker.SMALL:
            header = unpacker.unpack(view[:hl])
        else:
            header = msgpack.unpackb(
                view[:hl], use_list=False, raw=False, strict_map_key=True, **_UNPACK_LIMITS
            )
    except Exception as exc:  # msgpack raises ValueError/TypeError/its own types on hostile input
        raise RemoteProtocolError(f"malformed header map: {type(exc).__name__}: {exc}", peer=peer) from None
    if type(header) is not dict or not all(map(isinstance, header, _STR)):
        raise RemoteProtocolError("header is not a map with string keys", peer=peer)
    lengths = header.pop(BUFFERS_KEY, ())
    if not lengths:
        if type(lengths) is not tuple or fixed.body_len:
            _bad_lengths(lengths, fixed, peer)
        return RawFrame(fixed.version, fixed.msg_type, fixed.flags, header, [])
    if (
        type(lengths) is not tuple
        or len(lengths) > MAX_BUFFERS_PER_MESSAGE
        or not all(type(n) is int and n >= 0 for n in lengths)
        or sum(lengths) != fixed.body_len
    ):
        _bad_lengths(lengths, fixed, peer)
    buffers: list[memoryview] = []
    pos = hl + pad
    for n in lengths:
        buffers.append(view[pos : pos + n])
        pos += n
    return RawFrame(fixed.version, fixed.msg_type, fixed.flags, header, buffers)


def _bad_lengths(lengths: Any, fixed: FixedHeader, peer: str | None) -> None:
    if not isinstance(lengths, tuple) or (
        lengths
        and (len(lengths) > MAX_BUFFERS_PER_MESSAGE or not all(type(n) is int and n >= 0 for n in lengths))
    ):
        raise RemoteProtocolError("bad buffer length list", peer=peer)
    raise RemoteProtocolError(
        "buffer lengths do not add up to the body length",
        peer=peer,
        value=sum(lengths),
        limit=fixed.body_len,
    )


class FrameReader:
    """Accumulates received bytes and cuts them into frames, copying every byte exactly once.

    Incoming chunks are kept by reference in a deque until a frame's fixed header is complete; then the
    caller's ``admit`` hook vets it (type allowed now? size within the limit for this state?) and only then
    is its buffer filled, growing with the bytes that actually arrive (never allocated at the announced
    size up front). Feeding one byte at a time costs O(1) per byte (amortised).
    """

    def __init__(self, *, peer: str | None = None) -> None:
        self.peer = peer
        self._chunks: deque[memoryview] = deque()
        self._avail = 0
        self._fixed: FixedHeader | None = None
        self._fixed_bytes: bytes | memoryview = b""
        self._unpacker = HeaderUnpacker()
        self._buf: bytearray | None = None
        self._filled = 0
        self.eof = False

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Queue received bytes (b"" marks EOF). Non-``bytes`` input is copied: the caller may reuse it."""
        if not data:
            self.eof = True
            return
        chunk = memoryview(data if isinstance(data, bytes) else bytes(data))
        self._chunks.append(chunk)
        self._avail += len(chunk)

    @property
    def mid_frame(self) -> bool:
        """True when part of a frame has been received but not all of it."""
        return self._fixed is not None or self._avail > 0

    @property
    def missing(self) -> int:
        """Bytes still to arrive before the frame in progress is complete: 0 between frames and while its
        fixed header is incomplete (its length is unknown then). What a receiver may wait for before it
        needs to look at the stream again (``StreamTransport.expect``)."""
        if self._fixed is None:
            return 0
        return max(0, self._fixed.rest_len - self._filled - self._avail)

    @property
    def held_bytes(self) -> int:
        """Bytes this reader holds: a partial frame's whole buffer plus the chunks not cut yet."""
        return self._avail + (len(self._buf) if self._buf is not None else 0)

    def discard(self) -> None:
        """Drop every buffered byte (the connection ended): a peer that announced a 256 MiB frame and left
        must not keep that buffer alive for as long as something still refers to this connection (security
        probe, issue 21: RSS at 1.1-1.4 GB under a frame-and-drop loop)."""
        self._chunks.clear()
        self._avail = 0
        self._fixed, self._buf, self._filled = None, None, 0
        self._fixed_bytes = b""

    @property
    def unread(self) -> int:
        """Bytes fed that are not part of a frame returned yet (a partial frame's included)."""
        partial = FIXED_HEADER_BYTES + self._filled if self._fixed is not None else 0
        return self._avail + partial

    def _take_small(self, n: int) -> bytes:
        first = self._chunks[0]
        if len(first) >= n:
            out = bytes(first[:n])
            if len(first) == n:
                self._chunks.popleft()
            else:
                self._chunks[0] = first[n:]
        else:
            parts = bytearray()
            while len(parts) < n:
                c = self._chunks[0]
                k = min(len(c), n - len(parts))
                parts += c[:k]
                if k == len(c):
                    self._chunks.popleft()
                else:
                    self._chunks[0] = c[k:]
            out = bytes(parts)
        self._avail -= n
        return out

    def next_frame(self, admit: Callable[[FixedHeader], None]) -> RawFrame | None:
        """Return the next complete frame, or None when more bytes are needed.

        ``admit`` is called once per frame with its fixed header before any body byte is buffered; it raises
        to refuse the frame.
        """
        if self._fixed is None:
            if self._avail < FIXED_HEADER_BYTES:
                return None
            first = self._chunks[0]
            if len(first) >= FIXED_HEADER_BYTES:
                # the common case: the fixed header in one received chunk, often the whole frame too
                fixed = _checked_fixed(_FIXED.unpack_from(first), self.peer)
                admit(fixed)
                end = FIXED_HEADER_BYTES + fixed.header_len + fixed.pad + fixed.body_len
                if len(first) >= end:  # the whole frame: one copy of its body, no partial-frame state
                    body = bytearray(first[FIXED_HEADER_BYTES:end])
                    self._avail -= end
                    if len(first) == end:
                        self._chunks.popleft()
                    else:
                        self._chunks[0] = first[end:]
                    return decode_frame_body(
                        fixed, first[:FIXED_HEADER_BYTES], body, peer=self.peer, unpacker=self._unpacker
                    )
                raw: bytes | memoryview = first[:FIXED_HEADER_BYTES]
                if len(first) == FIXED_HEADER_BYTES:
                    self._chunks.popleft()
                else:
                    self._chunks[0] = first[FIXED_HEADER_BYTES:]
                self._avail -= FIXED_HEADER_BYTES
            else:
                raw = self._take_small(FIXED_HEADER_BYTES)
                fixed = parse_fixed_header(raw, peer=self.peer)
                admit(fixed)
            self._fixed, self._fixed_bytes = fixed, raw
            # grown as the bytes arrive, not allocated at the announced size: a peer that announces 256 MiB
            # and sends 1 MiB costs 1 MiB (security probe, issue 21). Growing a large bytearray is a
            # realloc, which moves pages (mremap) rather than copying them, so each byte is still copied once.
            self._buf = bytearray()
            self._filled = 0
        fixed = self._fixed
        buf = self._buf
        assert buf is not None
        need = fixed.rest_len
        if self._filled < need:
            while self._filled < need and self._chunks:
                c = self._chunks[0]
                k = min(len(c), need - self._filled)
                buf += c[:k]
                self._filled += k
                self._avail -= k
                if k == len(c):
                    self._chunks.popleft()
                else:
                    self._chunks[0] = c[k:]
            if self._filled < need:
                return None
        self._fixed, self._buf = None, None
        return decode_frame_body(fixed, self._fixed_bytes, buf, peer=self.peer, unpacker=self._unpacker)
