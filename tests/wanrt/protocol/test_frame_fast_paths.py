"""The receive fast paths give the same frames and the same refusals as the general ones: a whole frame
in one received chunk (parsed in place), and small header maps decoded by one reused msgpack Unpacker."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wanrt.errors import RemoteProtocolError
from wanrt.protocol.frame import (
    _UNPACK_LIMITS,
    FrameReader,
    HeaderUnpacker,
    decode_frame_body,
    encode_frame,
    parse_fixed_header,
)
from wanrt.protocol.limits import FIXED_HEADER_BYTES


def _frame(i: int, nbuf: int) -> bytes:
    bufs = [bytes([i % 256]) * (k * 7 + i % 5) for k in range(nbuf)]
    return b"".join(encode_frame(1, 0x10 + i % 4, {"i": i, "s": "x" * (i % 9)}, bufs))


def _frames_of(chunks: list[bytes]) -> list[tuple[int, dict, list[bytes]]]:
    reader = FrameReader()
    out = []
    for c in chunks:
        reader.feed(c)
        while (f := reader.next_frame(lambda fixed: None)) is not None:
            out.append((f.msg_type, f.header, [bytes(b) for b in f.buffers]))
    assert not reader.mid_frame
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=8), st.lists(st.integers(1, 200), max_size=10))
def test_any_cut_of_a_stream_gives_the_same_frames(nbufs: list[int], cuts: list[int]) -> None:
    """Whole frames, several frames, and a frame's tail in one chunk; headers split anywhere."""
    blob = b"".join(_frame(i, n) for i, n in enumerate(nbufs))
    pos, chunks = 0, []
    for c in cuts:
        chunks.append(blob[pos : pos + c])
        pos += c
    chunks.append(blob[pos:])
    chunks = [c for c in chunks if c]
    assert _frames_of(chunks) == _frames_of([blob[i : i + 1] for i in range(len(blob))])
    assert len(_frames_of(chunks)) == len(nbufs)


def test_a_refused_header_in_a_whole_chunk_is_refused_before_its_body() -> None:
    blob = _frame(1, 2)
    reader = FrameReader()
    reader.feed(blob)
    seen = []

    def admit(fixed: object) -> None:
        seen.append(fixed)
        raise RemoteProtocolError("no")

    with pytest.raises(RemoteProtocolError):
        reader.next_frame(admit)
    assert len(seen) == 1


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=64),
        st.builds(
            lambda b, t: msgpack.packb(b) + t,
            st.dictionaries(st.text(max_size=4), st.integers(-(2**63), 2**64 - 1)),
            st.binary(max_size=3),
        ),
    )
)
def test_the_reused_unpacker_accepts_and_refuses_what_unpackb_does(blob: bytes) -> None:
    u = HeaderUnpacker()
    good = _frame(3, 1)
    fixed = parse_fixed_header(good[:FIXED_HEADER_BYTES])
    try:
        want = ("ok", msgpack.unpackb(blob, use_list=False, raw=False, strict_map_key=True, **_UNPACK_LIMITS))
    except Exception:
        want = ("error", None)
    try:
        got = ("ok", u.unpack(blob))
    except Exception:
        got = ("error", None)
    assert got == want
    # whatever came before, the unpacker still decodes the next good header
    rest = bytearray(good[FIXED_HEADER_BYTES:])
    frame = decode_frame_body(fixed, good[:FIXED_HEADER_BYTES], rest, unpacker=u)
    assert frame.header == {"i": 3, "s": "xxx"}


def test_the_reused_unpacker_refuses_trailing_and_truncated_maps() -> None:
    u = HeaderUnpacker()
    one = msgpack.packb({"a": 1})
    with pytest.raises(ValueError):
        u.unpack(one + b"\x01")
    with pytest.raises((ValueError, msgpack.UnpackException)):
        u.unpack(one[:-1])
    assert u.unpack(one) == {"a": 1}
    assert u.unpack(one) == {"a": 1}
