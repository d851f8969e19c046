"""Framing: layout, alignment, checksum, limits checked from the fixed header alone, one-copy assembly."""

from __future__ import annotations

import struct
import tracemalloc
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.wanrt.protocol.pair import authenticated_pair
from wanrt.errors import LimitExceeded, LocalProtocolError, RemoteProtocolError
from wanrt.payload import SparsePayload
from wanrt.protocol import Push
from wanrt.protocol.frame import MAGIC, FixedHeader, FrameReader, encode_frame, parse_fixed_header
from wanrt.protocol.limits import FIXED_HEADER_BYTES, MAX_BUFFERS_PER_MESSAGE, MAX_HEADER_BYTES


def read_all(blob: bytes, step: int | None = None) -> list:
    reader = FrameReader()
    frames = []
    chunks = [blob] if step is None else [blob[i : i + step] for i in range(0, len(blob), step)]
    for c in chunks:
        reader.feed(c)
        while (f := reader.next_frame(lambda fixed: None)) is not None:
            frames.append(f)
    assert not reader.mid_frame
    return frames


def test_fixed_header_layout_matches_the_documentation() -> None:
    parts = encode_frame(3, 0x12, {"a": 1}, [b"xyz", b"0123"])
    head = bytes(parts[0])
    magic, version, mtype, flags, pad, reserved, hl, bl, crc = struct.unpack("!4sBBHB3sIII", head[:24])
    assert (magic, version, mtype, flags, reserved) == (b"WNRT", 3, 0x12, 0, b"\0\0\0")
    assert bl == 7 and (24 + hl + pad) % 8 == 0 and len(head) == 24 + hl + pad
    body = b"xyz0123"
    assert crc == zlib.crc32(head[:20] + head[24:] + body)
    assert [bytes(p) for p in parts[1:]] == [b"xyz", b"0123"]


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=8).filter(lambda k: not k.startswith("_")),
        st.integers(-(2**63), 2**64 - 1),
        max_size=5,
    ),
    st.lists(st.binary(max_size=100), max_size=MAX_BUFFERS_PER_MESSAGE),
    st.sampled_from([None, 1, 5, 64]),
)
def test_frames_round_trip_whole_and_split(header: dict, buffers: list[bytes], step: int | None) -> None:
    blob = b"".join(encode_frame(1, 0x10, header, buffers)) * 2
    frames = read_all(blob, step)
    assert len(frames) == 2
    for f in frames:
        assert f.header == header
        assert [bytes(b) for b in f.buffers] == buffers


def test_buffers_start_aligned_and_are_views_of_one_writable_buffer() -> None:
    for key_len in range(1, 12):
        (f,) = read_all(b"".join(encode_frame(1, 0x10, {"k" * key_len: 1}, [b"a" * 8, b"b" * 16])))
        a, b = f.buffers
        assert a.obj is b.obj and isinstance(a.obj, bytearray)
        arr = np.frombuffer(a, dtype=np.int64)
        assert arr.ctypes.data % 8 == 0 and arr.flags.writeable


@pytest.mark.parametrize(
    ("mutate", "error"),
    [
        (lambda h: b"HTTP" + h[4:], RemoteProtocolError),
        (lambda h: h[:4] + b"\x00" + h[5:], RemoteProtocolError),  # version 0
        (lambda h: h[:9] + b"\x01" + h[10:], RemoteProtocolError),  # reserved byte
        (lambda h: h[:8] + b"\x09" + h[9:], RemoteProtocolError),  # pad >= 8
        (lambda h: h[:12] + struct.pack("!I", 0) + h[16:], RemoteProtocolError),
        (lambda h: h[:12] + struct.pack("!I", MAX_HEADER_BYTES + 1) + h[16:], LimitExceeded),
    ],
)
def test_bad_fixed_headers_are_refused(mutate, error) -> None:  # type: ignore[no-untyped-def]
    head = bytes(encode_frame(1, 1, {"a": 1})[0])[:FIXED_HEADER_BYTES]
    with pytest.raises(error):
        parse_fixed_header(mutate(head))


def test_checksum_catches_a_flipped_body_bit() -> None:
    blob = bytearray(b"".join(encode_frame(1, 0x10, {"a": 1}, [b"payload!"])))
    blob[-3] ^= 0x10
    with pytest.raises(RemoteProtocolError, match="checksum"):
        read_all(bytes(blob))


def test_buffer_lengths_must_add_up_to_the_body() -> None:
    # a frame whose map lists 3 bytes of buffers while the fixed header announces 4
    blob = bytearray(b"".join(encode_frame(1, 0x10, {"a": 1}, [b"abc"])))
    body_len = struct.unpack_from("!I", blob, 16)[0]
    struct.pack_into("!I", blob, 16, body_len + 1)
    blob += b"d"
    struct.pack_into("!I", blob, 20, zlib.crc32(bytes(blob[:20]) + bytes(blob[24:])))
    with pytest.raises(RemoteProtocolError, match="add up"):
        read_all(bytes(blob))


def test_huge_announced_body_is_refused_from_the_fixed_header_before_allocating() -> None:
    pair = authenticated_pair()
    head = bytearray(
        bytes(pair.client.send_parts(Push("job-1", 1, 0, 0, "a", SparsePayload.empty(0, 8, 1)))[0])
    )
    struct.pack_into("!I", head, 16, 2**31)
    tracemalloc.start()
    try:
        pair.server.receive_data(bytes(head[:FIXED_HEADER_BYTES]))  # only the 24 fixed bytes
        with pytest.raises(LimitExceeded) as info:
            pair.server.next_event()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.fields["value"] > 2**31 and peak < 1 << 20


def test_local_frame_limits() -> None:
    with pytest.raises(LocalProtocolError):
        encode_frame(1, 1, {"_b": 1})
    with pytest.raises(LocalProtocolError):
        encode_frame(1, 1, {"a": "x" * (MAX_HEADER_BYTES + 1)})
    with pytest.raises(LocalProtocolError):
        encode_frame(1, 1, {"a": 1}, [b"x"] * (MAX_BUFFERS_PER_MESSAGE + 1))
    with pytest.raises(LocalProtocolError):
        encode_frame(1, 1, {"a": 1}, [bytes(100)], max_frame=64)
    with pytest.raises(LocalProtocolError):
        encode_frame(1, 1, {"a": object()})


def test_big_frame_fed_in_64k_chunks_is_assembled_with_one_copy_into_views() -> None:
    """8 Mi fp32 values: the reader allocates the frame once and the payload values are views of it."""
    n = 8 * 1024 * 1024 // 4
    pair = authenticated_pair()
    bs = 1024  # few, wide blocks: the indices are negligible, the values are the frame
    p = SparsePayload(0, n, bs, np.arange(n // bs, dtype=np.int64), np.ones(n, np.float32))
    blob = pair.client.send(Push("job-1", 1, 0, 0, "a", p))
    pieces = [blob[i : i + 65536] for i in range(0, len(blob), 65536)]
    del blob, p
    tracemalloc.start()
    try:
        for piece in pieces:
            pair.server.receive_data(piece)
        got = pair.server.next_event()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(got, Push)
    frame_bytes = sum(map(len, pieces))
    values = got.payload.values
    assert isinstance(values.base, memoryview) and isinstance(values.base.obj, bytearray)
    assert len(values.base.obj) >= values.nbytes  # a view into the frame buffer, not a copy
    # the one frame buffer and nothing else of its size (a second copy would double the peak)
    assert frame_bytes <= peak < frame_bytes + (1 << 20)
    assert float(values.sum()) == n


def test_reader_reports_partial_frames() -> None:
    blob = b"".join(encode_frame(1, 1, {"a": 1}))
    reader = FrameReader()
    reader.feed(blob[:5])
    assert reader.next_frame(lambda fixed: None) is None and reader.mid_frame
    reader.feed(blob[5:])
    assert reader.next_frame(lambda fixed: None) is not None and not reader.mid_frame


def test_admit_hook_sees_the_header_before_the_body_arrives() -> None:
    blob = b"".join(encode_frame(1, 0x10, {"a": 1}, [bytes(1000)]))
    seen: list[FixedHeader] = []
    reader = FrameReader()
    reader.feed(blob[:FIXED_HEADER_BYTES])
    assert reader.next_frame(seen.append) is None
    assert len(seen) == 1 and seen[0].body_len == 1000 and seen[0].msg_type == 0x10
    assert blob[:4] == MAGIC


def test_an_announced_frame_costs_what_arrived_not_what_was_announced() -> None:
    """Security probe (issue 21): a 256 MiB frame announced, 1 MiB sent, then the link dropped, every
    0.7 s, kept the gateway at 1.1-1.4 GB. The buffer grows with the bytes that arrive."""
    from wanrt.protocol.frame import FrameReader, encode_frame
    from wanrt.protocol.limits import MAX_FRAME_BYTES

    head = bytearray(b"".join(bytes(v) for v in encode_frame(1, 0x10, {"k": 1}, [b"x" * 8])))[:-8]
    struct.pack_into("!I", head, 16, MAX_FRAME_BYTES - len(head))  # body_len: a 256 MiB frame
    reader = FrameReader()
    reader.feed(bytes(head) + bytes(1 << 20))
    assert reader.next_frame(lambda fixed: None) is None  # admitted, incomplete
    assert reader.held_bytes < 2 << 20  # ~1 MiB held, not 256 MiB
    reader.discard()
    assert reader.held_bytes == 0
