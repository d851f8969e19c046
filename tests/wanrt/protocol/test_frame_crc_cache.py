"""A large read-only buffer framed again (a result sent to each child) reuses its remembered CRC: the
frames are byte for byte those of a plain checksum, whatever precedes the buffer; writable buffers are
never remembered, so changing them between frames is still framed correctly."""

from __future__ import annotations

import os
import random
import zlib

import numpy as np

from wanrt.protocol.frame import FrameReader, _advance, encode_frame


def _plain_crc_ok(frame: bytes) -> bool:
    reader = FrameReader()
    reader.feed(frame)
    return reader.next_frame(lambda fixed: None) is not None  # raises on a checksum mismatch


def test_advance_is_a_crc_through_zero_bytes() -> None:
    rng = random.Random(5)
    for n in (4096, 4100, 16384, 100_000):
        zeros = bytes(n)
        for _ in range(8):
            c = rng.getrandbits(32)
            assert _advance(c, n) == zlib.crc32(zeros, c) ^ zlib.crc32(zeros, 0)


def test_the_same_read_only_buffer_in_many_frames() -> None:
    values = np.frombuffer(os.urandom(16384), dtype=np.float32)  # read-only, like a decoded result
    view = memoryview(values.data).cast("B")
    ids = os.urandom(6000)
    for seq in range(10):  # each frame's header differs, so the CRC before the buffers does too
        parts = encode_frame(1, 0x90, {"seq": seq, "x": "y" * seq}, [memoryview(ids), view])
        assert _plain_crc_ok(b"".join(parts))


def test_a_writable_buffer_changed_between_frames_is_checksummed_anew() -> None:
    arr = np.zeros(8192, dtype=np.float32)
    view = memoryview(arr.data).cast("B")
    for k in range(3):
        arr[100] = k
        assert _plain_crc_ok(b"".join(encode_frame(1, 0x90, {"k": k}, [view])))


def test_a_read_only_view_of_an_array_written_elsewhere_is_checksummed_anew() -> None:
    """Read-only is not immutable: the array behind the view may change through another view."""
    arr = np.zeros(8192, dtype=np.float32)
    frozen = arr.view()
    frozen.flags.writeable = False
    view = memoryview(frozen.data).cast("B")
    assert view.readonly
    for k in range(3):
        arr[100] = k  # written through the writable array
        assert _plain_crc_ok(b"".join(encode_frame(1, 0x90, {"k": k}, [view])))
