"""Rice-coded block indices: exact round trips, near the entropy bound, and a decoder that trusts nothing."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wanrt.codec import decode_payload, encode_payload
from wanrt.codec.index_encodings import encoded_sizes_of
from wanrt.codec.kernel_choice import codec_kernels
from wanrt.codec.lowbit import quantise_payload
from wanrt.codec.rice_index import rice_decode, rice_encode, rice_k, rice_size_bound
from wanrt.errors import MalformedPayload
from wanrt.payload import SparsePayload


def _stream(idx: np.ndarray) -> tuple[bytes, int]:
    n = int(idx.shape[0])
    gap_sum = int(idx[-1]) + 1 - n if n else 0
    k = rice_k(n, gap_sum)
    out = rice_encode(idx, k).tobytes()
    assert len(out) <= rice_size_bound(n, gap_sum, k)
    return out, k


@settings(deadline=None, max_examples=200)
@given(
    nb=st.integers(1, 5000),
    data=st.data(),
)
def test_round_trip(nb: int, data: st.DataObject) -> None:
    idx = np.array(sorted(data.draw(st.sets(st.integers(0, nb - 1), max_size=300))), dtype=np.int64)
    buf, _ = _stream(idx)
    np.testing.assert_array_equal(rice_decode(memoryview(buf), idx.shape[0], nb), idx)


@pytest.mark.parametrize("density", [0.001, 0.01, 0.1])
def test_within_two_percent_of_the_entropy_bound(density: float) -> None:
    nb = 1_562_500  # 25 M elements in blocks of 16
    rng = np.random.default_rng(0)
    idx = np.sort(rng.choice(nb, size=round(nb * density), replace=False)).astype(np.int64)
    buf, _ = _stream(idx)
    d = idx.shape[0] / nb
    bound = (-d * math.log2(d) - (1 - d) * math.log2(1 - d)) / d / 8 * idx.shape[0]
    assert len(buf) <= bound * 1.02
    assert len(buf) < encoded_sizes_of(idx, nb, codec_kernels())["varint"] * 0.85


def test_low_bit_payloads_pick_rice_and_float_payloads_keep_varint() -> None:
    rng = np.random.default_rng(1)
    nb = 100_000
    idx = np.sort(rng.choice(nb, size=1000, replace=False)).astype(np.int64)
    p = SparsePayload(0, nb * 16, 16, idx, rng.standard_normal(16_000).astype(np.float32))
    assert encode_payload(p)[0]["index"] == "varint"
    meta, buffers = encode_payload(quantise_payload(p, "int2"))
    assert meta["index"] == "rice"
    np.testing.assert_array_equal(decode_payload(meta, [bytes(b) for b in buffers]).indices, idx)
    forced = encode_payload(p, index_encoding="rice")
    assert forced[0]["index"] == "rice"


def _bad(buf: bytes, count: int, nb: int, match: str) -> None:
    with pytest.raises(MalformedPayload, match=match):
        rice_decode(memoryview(buf), count, nb)


def test_decoder_refuses_inconsistent_streams() -> None:
    idx = np.array([3, 9, 40, 41, 90], np.int64)
    buf, k = _stream(idx)
    assert k > 0
    _bad(b"", 5, 100, "no parameter byte")
    _bad(bytes([41]) + buf[1:], 5, 100, "parameter out of range")
    _bad(buf, 6, 100, "count|shorter")
    _bad(buf + b"\x00", 5, 100, "after the last gap")
    _bad(buf[:-1] + bytes([buf[-1] | 0x80]), 5, 100, "count|after the last")
    _bad(buf, 5, 50, "beyond the layer")
    _bad(bytes([0]) + b"\x00" * 40 + b"\x01", 1, 100, "beyond the layer")  # a gap of 320 in 100 blocks
    _bad(bytes([0, 1]), 0, 100, "after an empty stream")
    assert rice_decode(memoryview(bytes([0])), 0, 100).shape == (0,)
    # remainder padding bits must be zero: k=3 for 5 gaps uses 15 of 16 bits
    k3 = np.array([1, 5, 9, 13, 17], np.int64)
    raw = bytearray(rice_encode(k3, 3).tobytes())
    raw[2] |= 0x80
    _bad(bytes(raw), 5, 100, "beyond the last remainder")


@settings(deadline=None, max_examples=200)
@given(data=st.data())
def test_random_bytes_decode_or_raise(data: st.DataObject) -> None:
    buf = data.draw(st.binary(max_size=64))
    count = data.draw(st.integers(0, 80))
    nb = data.draw(st.integers(1, 10_000))
    try:
        out = rice_decode(memoryview(buf), count, nb)
    except MalformedPayload:
        return
    assert out.shape == (count,)
    if count:
        assert out[0] >= 0 and out[-1] < nb and np.all(np.diff(out) > 0)
