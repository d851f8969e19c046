"""wanrt.codec: exact round trips, precision of downcasts, zero copy, and every way a peer can lie."""

from __future__ import annotations

import os
import tracemalloc
from collections.abc import Callable
from typing import Any
from unittest import mock

import msgpack
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wanrt.codec import (
    CODEC_VERSION,
    INDEX_ENCODINGS,
    MAX_PAYLOAD_ELEMENTS,
    META_KEYS,
    decode_payload,
    encode_payload,
)
from wanrt.codec.index_encodings import DEFAULT_CHOICES, encoded_sizes_of
from wanrt.codec.kernel_choice import KERNEL_ENV, codec_kernels
from wanrt.errors import (
    KernelError,
    LimitExceeded,
    LocalProtocolError,
    MalformedPayload,
    RemoteProtocolError,
)
from wanrt.payload import VALUE_DTYPES, SparsePayload, bf16_to_fp32, fp32_to_bf16, n_blocks

DTYPES = ("fp32", "fp16", "bf16")


def make_payload(
    dense_len: int,
    block_size: int,
    chosen: list[int],
    dtype: str = "fp32",
    seed: int = 0,
    layer: int = 3,
) -> SparsePayload:
    """A valid payload over the given blocks, tail padding zeroed, values in ``dtype``."""
    rng = np.random.default_rng(seed)
    dense = (rng.standard_normal(dense_len) * 10.0).astype(np.float32)
    p = SparsePayload.from_dense_blocks(layer, dense, np.array(chosen, dtype=np.int64), block_size)
    if dtype == "fp32":
        return p
    vals = p.values.astype(np.float16) if dtype == "fp16" else fp32_to_bf16(p.values)
    return SparsePayload(layer, dense_len, block_size, p.indices, vals, dtype)


def through_wire(meta: dict[str, Any], bufs: list[memoryview]) -> tuple[Any, list[memoryview]]:
    """What the receiving side sees: meta re-read from msgpack, buffers sliced out of one received frame."""
    meta2 = msgpack.unpackb(msgpack.packb(meta))
    frame = b"".join(bytes(b) for b in bufs)
    mv = memoryview(frame)
    out, off = [], 0
    for b in bufs:
        out.append(mv[off : off + len(b)])
        off += len(b)
    return meta2, out


def bits(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Bit patterns, so that NaN == NaN and -0.0 != 0.0 in comparisons."""
    return a.view(np.uint32 if a.dtype.itemsize == 4 else np.uint16)


@st.composite
def payloads(draw: st.DrawFn, max_len: int = 3000) -> SparsePayload:
    dense_len = draw(st.integers(0, max_len))
    block_size = draw(st.sampled_from([1, 2, 3, 16, 64]))
    nb = n_blocks(dense_len, block_size)
    density = draw(st.sampled_from([0.0, 0.01, 0.1, 0.5, 1.0]))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    k = min(nb, round(nb * density) + draw(st.integers(0, 2)))
    chosen = sorted(rng.choice(nb, size=k, replace=False).tolist()) if k else []
    return make_payload(dense_len, block_size, chosen, draw(st.sampled_from(DTYPES)), seed)


@settings(max_examples=150, deadline=None)
@given(
    p=payloads(),
    wire=st.sampled_from([None, "fp32", "fp16", "bf16"]),
    enc=st.sampled_from([None, *INDEX_ENCODINGS]),
    kernels=st.sampled_from(["fused", "numpy"]),
)
def test_round_trip(p: SparsePayload, wire: str | None, enc: Any, kernels: str) -> None:
    with mock.patch.dict(os.environ, {KERNEL_ENV: kernels}):
        check_round_trip(p, wire, enc)


def check_round_trip(p: SparsePayload, wire: str | None, enc: Any) -> None:
    nb = n_blocks(p.dense_len, p.block_size)
    if enc is not None and enc not in encoded_sizes_of(p.indices, nb, codec_kernels()):
        with pytest.raises(LocalProtocolError):
            encode_payload(p, wire_dtype=wire, index_encoding=enc)
        return
    meta, bufs = encode_payload(p, wire_dtype=wire, index_encoding=enc)
    assert set(meta) == META_KEYS
    q = decode_payload(*through_wire(meta, bufs), peer="p")
    assert (q.layer, q.dense_len, q.block_size) == (p.layer, p.dense_len, p.block_size)
    np.testing.assert_array_equal(q.indices, p.indices)
    assert q.value_dtype == meta["dtype"]
    if q.value_dtype == p.value_dtype:
        np.testing.assert_array_equal(bits(q.values), bits(p.values))
    else:
        # downcasts: relative error bounded by the target's mantissa (values here are normal numbers)
        src = p.values_f32()
        tol = {"fp32": 0.0, "fp16": 2.0**-11, "bf16": 2.0**-8}[q.value_dtype]
        np.testing.assert_allclose(q.values_f32(), src, rtol=tol, atol=2.0**-24 if tol else 0.0)
    if enc is None:  # the smallest; rice is picked for low-bit values only (test_lowbit.py)
        sizes = encoded_sizes_of(p.indices, nb, codec_kernels())
        assert len(bufs[1]) == min(v for e, v in sizes.items() if e in DEFAULT_CHOICES)


def test_fp32_round_trip_keeps_every_bit_pattern() -> None:
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -3.4e38, 1.0 + 2**-23], np.float32)
    p = SparsePayload(0, 8, 1, np.arange(8, dtype=np.int64), special)
    q = decode_payload(*through_wire(*encode_payload(p)))
    np.testing.assert_array_equal(bits(q.values), bits(special))


def test_empty_layer_and_empty_payload() -> None:
    for dense_len in (0, 17):
        p = SparsePayload.empty(5, dense_len, 16)
        for enc in INDEX_ENCODINGS:
            meta, bufs = encode_payload(p, index_encoding=enc)
            q = decode_payload(*through_wire(meta, bufs))
            assert q.nnz_blocks == 0 and q.dense_len == dense_len


# --------------------------------------------------------------------------------------------- zero copy


def test_same_dtype_is_zero_copy_on_both_sides() -> None:
    p = make_payload(1000, 16, [0, 3, 62], "fp32")
    meta, bufs = encode_payload(p)
    assert np.shares_memory(np.frombuffer(bufs[0], np.uint8), p.values)
    received = bytearray(b"".join(bytes(b) for b in bufs))  # values first: aligned at the frame start
    q = decode_payload(meta, [memoryview(received)[: len(bufs[0])], memoryview(received)[len(bufs[0]) :]])
    assert np.shares_memory(q.values, np.frombuffer(received, np.uint8))
    assert not q.values.flags.owndata


def test_downcast_makes_exactly_one_copy_and_decode_none() -> None:
    p = make_payload(1000, 16, [0, 3, 62], "fp32")
    meta, bufs = encode_payload(p, wire_dtype="fp16")
    assert meta["dtype"] == "fp16"
    assert not np.shares_memory(np.frombuffer(bufs[0], np.uint8), p.values)
    assert len(bufs[0]) == p.nnz * 2
    q = decode_payload(meta, bufs)
    assert np.shares_memory(q.values, np.frombuffer(bufs[0], np.uint8))


def test_misaligned_values_are_copied_once_and_still_correct() -> None:
    p = make_payload(1000, 16, [0, 3, 62], "fp32")
    meta, bufs = encode_payload(p)
    frame = bytearray(1) + bytes(bufs[0])
    q = decode_payload(meta, [memoryview(frame)[1:], bufs[1]])
    assert q.values.flags.aligned
    assert not np.shares_memory(q.values, np.frombuffer(frame, np.uint8))
    np.testing.assert_array_equal(q.values, p.values)


# --------------------------------------------------------------------------------------------- precision


def test_fp16_overflow_falls_back_to_source_dtype() -> None:
    vals = np.zeros(16, np.float32)
    vals[3] = 70000.0
    p = SparsePayload(0, 16, 16, np.array([0], np.int64), vals)
    meta, bufs = encode_payload(p, wire_dtype="fp16")
    assert meta["dtype"] == "fp32"
    assert np.shares_memory(np.frombuffer(bufs[0], np.uint8), p.values)
    np.testing.assert_array_equal(decode_payload(meta, bufs).values, vals)


def test_fp16_keeps_largest_finite_and_passes_infinities_through() -> None:
    vals = np.array([65519.0, -65504.0, np.inf, -np.inf], np.float32)  # 65519 rounds down to 65504
    p = SparsePayload(0, 4, 1, np.arange(4, dtype=np.int64), vals)
    meta, bufs = encode_payload(p, wire_dtype="fp16")
    assert meta["dtype"] == "fp16"
    np.testing.assert_array_equal(decode_payload(meta, bufs).values_f32(), [65504, -65504, np.inf, -np.inf])


def test_bf16_overflow_source_falls_back_to_bf16_not_fp32() -> None:
    vals = fp32_to_bf16(np.array([1e30, 1.0], np.float32))
    p = SparsePayload(0, 2, 1, np.arange(2, dtype=np.int64), vals, "bf16")
    meta, _ = encode_payload(p, wire_dtype="fp16")
    assert meta["dtype"] == "bf16"


@pytest.mark.parametrize(("wire", "rel"), [("fp16", 2.0**-11), ("bf16", 2.0**-8)])
def test_downcast_relative_error_bound(wire: str, rel: float) -> None:
    rng = np.random.default_rng(4)
    # normal range of fp16 (>= 2**-14) up to its max; bf16 shares it
    mag = np.exp2(rng.uniform(-14, 15.9, 20000)).astype(np.float32)
    vals = (mag * rng.choice([-1, 1], mag.shape)).astype(np.float32)
    p = SparsePayload(0, vals.shape[0], 1, np.arange(vals.shape[0], dtype=np.int64), vals)
    q = decode_payload(*encode_payload(p, wire_dtype=wire))
    err = np.abs(q.values_f32() - vals) / np.abs(vals)
    assert float(err.max()) <= rel
    assert float(err.max()) > rel / 4  # the bound is tight, i.e. the cast really happened


def test_fp16_subnormals_have_bounded_absolute_error() -> None:
    vals = np.array([1e-5, 3e-7, 5e-8, 2e-8], np.float32)
    p = SparsePayload(0, 4, 1, np.arange(4, dtype=np.int64), vals)
    q = decode_payload(*encode_payload(p, wire_dtype="fp16"))
    assert float(np.abs(q.values_f32() - vals).max()) <= 2.0**-25


def test_bf16_to_wire_uses_round_to_nearest_even() -> None:
    vals = np.array([1.0 + 2**-8, 1.0 + 3 * 2**-8], np.float32)  # exact ties
    p = SparsePayload(0, 2, 1, np.arange(2, dtype=np.int64), vals)
    q = decode_payload(*encode_payload(p, wire_dtype="bf16"))
    np.testing.assert_array_equal(q.values_f32(), bf16_to_fp32(fp32_to_bf16(vals)))
    np.testing.assert_array_equal(q.values_f32(), [1.0, 1.0 + 4 * 2**-8])


# --------------------------------------------------------------------------------------------- encoder misuse


def test_encoder_refuses_invalid_payloads_and_options() -> None:
    bad = SparsePayload(0, 40, 16, np.array([1, 0], np.int64), np.ones(32, np.float32))
    with pytest.raises(LocalProtocolError):
        encode_payload(bad)
    good = make_payload(40, 16, [0])
    with pytest.raises(LocalProtocolError):
        encode_payload(good, wire_dtype="fp8")
    with pytest.raises(LocalProtocolError):
        encode_payload(good, index_encoding="zstd")  # type: ignore[arg-type]
    wide = make_payload(16 * 70000, 16, [0, 69999])
    with pytest.raises(LocalProtocolError):
        encode_payload(wide, index_encoding="d16")  # gap 69998 does not fit 16 bits


def test_encoder_picks_measured_encodings() -> None:
    sparse = make_payload(160_000, 16, list(range(0, 10_000, 100)))  # gaps of 99: one varint byte each
    assert encode_payload(sparse)[0]["index"] == "varint"
    dense = make_payload(1600, 16, list(range(0, 100, 2)))  # half the blocks: bitmap
    assert encode_payload(dense)[0]["index"] == "bitmap"
    gappy = make_payload(16 * 2**20, 16, list(range(5000, 2**20, 5000)))  # gaps ~5000: 2 bytes either way
    meta, bufs = encode_payload(gappy)
    assert meta["index"] == "d16" and len(bufs[1]) == 2 * gappy.nnz_blocks


# --------------------------------------------------------------------------------------------- lying peers


def valid(
    enc: str = "u32", bs: int = 16, dense_len: int = 100, chosen: tuple[int, ...] = (0, 2, 6)
) -> tuple[dict[str, Any], list[bytes]]:
    meta, bufs = encode_payload(make_payload(dense_len, bs, list(chosen)), index_encoding=enc)  # type: ignore[arg-type]
    return meta, [bytes(b) for b in bufs]


def with_meta(**changes: Any) -> Callable[[], tuple[Any, list[bytes]]]:
    def build() -> tuple[Any, list[bytes]]:
        meta, bufs = valid()
        meta.update(changes)
        return meta, bufs

    return build


def with_index(enc: str, raw: bytes, count: int, dense_len: int = 100, bs: int = 1) -> Any:
    def build() -> tuple[Any, list[bytes]]:
        meta, _ = valid(enc, bs=bs, dense_len=dense_len, chosen=(0,))
        meta["count"] = count
        return meta, [bytes(4 * count * bs), raw]

    return build


def u32(*xs: int) -> bytes:
    return np.array(xs, "<u4").tobytes()


LIES: dict[str, Callable[[], tuple[Any, Any]]] = {
    "index out of range": with_index("u32", u32(0, 100), 2),
    "unsorted": with_index("u32", u32(5, 3), 2),
    "duplicated": with_index("u32", u32(5, 5), 2),
    "d16 sum beyond layer": with_index("d16", np.array([60, 60], "<u2").tobytes(), 2),
    "u32 buffer shorter than count": with_index("u32", u32(1, 2), 3),
    "u32 buffer longer than count": with_index("u32", u32(1, 2, 3, 4), 3),
    "d16 buffer odd length": with_index("d16", b"\x01\x00\x02", 2),
    "varint ends inside a varint": with_index("varint", b"\x01\x82", 2),
    "varint fewer than count": with_index("varint", b"\x01\x02", 3),
    "varint more than count": with_index("varint", b"\x01\x02\x03", 2),
    "varint count larger than buffer": with_index("varint", b"\x01", 50),
    "varint too long": with_index("varint", b"\x80\x80\x80\x80\x80\x00", 1, dense_len=10**6),
    "varint gap beyond layer": with_index("varint", b"\xe4\x00", 1),  # 100 in 2 bytes, 100 blocks
    "bitmap wrong length": with_index("bitmap", bytes(12), 0),
    "bitmap population": with_index("bitmap", b"\x07" + bytes(12), 2),
    "bitmap bits beyond layer": with_index("bitmap", bytes(12) + b"\x10", 1),
    "values buffer short": lambda: (valid()[0], [valid()[1][0][:-1], valid()[1][1]]),
    "values buffer long": lambda: (valid()[0], [valid()[1][0] + b"\0\0\0\0", valid()[1][1]]),
    "values for another dtype": with_meta(dtype="fp16"),
    "count too large for layer": with_meta(count=8),
    "unknown index encoding": with_meta(index="zstd"),
    "unknown dtype": with_meta(dtype="fp64"),
    "future format": with_meta(fmt=CODEC_VERSION + 1),
    "count is a string": with_meta(count="3"),
    "count is a bool": with_meta(count=True),
    "count is a float": with_meta(count=3.0),
    "dense_len negative": with_meta(dense_len=-1),
    "dense_len huge": with_meta(dense_len=2**70),
    "block_size zero": with_meta(block_size=0),
    "block_size huge": with_meta(block_size=10**6),
    "layer negative": with_meta(layer=-3),
    "dtype is bytes": with_meta(dtype=b"fp32"),
    "index is None": with_meta(index=None),
    "extra meta key": with_meta(extra=1),
    "missing meta key": lambda: ({k: v for k, v in valid()[0].items() if k != "count"}, valid()[1]),
    "meta not a map": lambda: ([1, 2, 3], valid()[1]),
    "one buffer": lambda: (valid()[0], valid()[1][:1]),
    "three buffers": lambda: (valid()[0], [*valid()[1], b""]),
    "buffers is bytes": lambda: (valid()[0], b"".join(valid()[1])),
    "buffer is an int": lambda: (valid()[0], [valid()[1][0], 7]),
    "buffer is None": lambda: (valid()[0], [None, valid()[1][1]]),
    "buffer is strided": lambda: (valid()[0], [memoryview(valid()[1][0] * 2)[::2], valid()[1][1]]),
    "huge string in meta": with_meta(dtype="x" * 100_000),
    "nonzero tail padding": lambda: (
        valid(chosen=(6,))[0],
        [np.ones(16, np.float32).tobytes(), valid(chosen=(6,))[1][1]],
    ),
}


@pytest.mark.parametrize("case", sorted(LIES))
def test_lying_payload_is_rejected(case: str) -> None:
    meta, bufs = LIES[case]()
    with pytest.raises(MalformedPayload) as info:
        decode_payload(meta, bufs, peer="evil")
    assert info.value.fields["peer"] == "evil"
    assert len(str(info.value)) < 300  # a peer cannot blow up our logs


def test_oversized_claims_are_refused_before_allocating() -> None:
    big_values = bytes(4 * 10_000_000)  # a real 40 MB values buffer, allocated before tracing starts
    tracemalloc.start()
    try:
        meta, bufs = valid()
        meta.update(dense_len=2**40, count=2**36)
        with pytest.raises(LimitExceeded) as info:
            decode_payload(meta, bufs)
        assert info.value.fields["limit"] == MAX_PAYLOAD_ELEMENTS
        meta.update(count=1000)
        with pytest.raises(LimitExceeded):
            decode_payload(meta, bufs, max_elements=999 * 16)
        # within the limit, but a tiny buffer claims 10M indices: refused by length, nothing allocated
        for enc in INDEX_ENCODINGS:
            meta.update(index=enc, count=10_000_000, block_size=1)
            with pytest.raises(MalformedPayload):
                decode_payload(meta, [memoryview(big_values), memoryview(b"\x01" * 64)])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


# --------------------------------------------------------------------------------------------- fuzz


ANY_VALUE = st.one_of(
    st.integers(-(2**70), 2**70),
    st.integers(-2, 40),
    st.booleans(),
    st.none(),
    st.floats(),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.sampled_from([*DTYPES, *INDEX_ENCODINGS]),
    st.lists(st.integers(), max_size=2),
)


@st.composite
def mutated(draw: st.DrawFn) -> tuple[Any, Any]:
    p = draw(payloads(max_len=400))
    meta, bufs = encode_payload(p, index_encoding=draw(st.sampled_from([None, "varint", "bitmap", "d16"])))
    if meta["index"] == "d16" and p.dense_len > 16 * 65536:  # pragma: no cover - max_len keeps it small
        meta, bufs = encode_payload(p)
    meta = dict(meta)
    raw = [bytearray(b) for b in bufs]
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["set", "del", "add", "flip", "cut", "grow", "swap", "bufs"]))
        if kind == "set":
            meta[draw(st.sampled_from(sorted(META_KEYS)))] = draw(ANY_VALUE)
        elif kind == "del" and meta:
            del meta[draw(st.sampled_from(sorted(meta)))]
        elif kind == "add":
            meta[draw(st.text(max_size=4))] = draw(ANY_VALUE)
        elif kind in ("flip", "cut", "grow") and raw:
            b = raw[draw(st.integers(0, len(raw) - 1))]
            if kind == "flip" and b:
                b[draw(st.integers(0, len(b) - 1))] ^= draw(st.integers(1, 255))
            elif kind == "cut" and b:
                del b[draw(st.integers(0, len(b) - 1)) :]
            elif kind == "grow":
                b.extend(draw(st.binary(min_size=1, max_size=9)))
        elif kind == "swap" and len(raw) == 2:
            raw.reverse()
        elif kind == "bufs":
            raw = draw(st.sampled_from([raw[:1], [*raw, bytearray(b"x")], []]))
    return meta, [memoryview(b) for b in raw]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=mutated())
def test_decode_only_raises_remote_protocol_errors(case: tuple[Any, Any]) -> None:
    meta, bufs = case
    try:
        p = decode_payload(meta, bufs, peer="fuzz")
    except RemoteProtocolError:
        return
    p.validate()  # anything accepted must be a payload every consumer can trust
    assert p.values.dtype == VALUE_DTYPES[p.value_dtype]


# --------------------------------------------------------------------------------------------- kernel paths

FUSED = codec_kernels("fused")
REFERENCE = codec_kernels("numpy")


def test_kernel_choice_follows_the_environment() -> None:
    assert FUSED.name == "fused" and REFERENCE.name == "numpy"
    with mock.patch.dict(os.environ, {KERNEL_ENV: "numpy"}):
        assert codec_kernels().name == "numpy"
    with pytest.raises(KernelError):
        codec_kernels("gpu-please")


@settings(max_examples=200, deadline=None)
@given(
    nb=st.one_of(st.integers(1, 2**40), st.integers(1, 300)),
    raw=st.lists(st.integers(0, 2**40), max_size=60),
    corrupt=st.booleans(),
)
def test_fused_gap_stats_and_varint_match_reference(nb: int, raw: list[int], corrupt: bool) -> None:
    idx = np.array(sorted({x % nb for x in raw}), dtype=np.int64)
    if corrupt and idx.shape[0] > 1:
        idx = idx[::-1].copy()  # unsorted: both must say invalid
    assert FUSED.gap_stats(idx, nb) == REFERENCE.gap_stats(idx, nb)
    if not REFERENCE.gap_stats(idx, nb)[0]:
        return
    nbytes = REFERENCE.gap_stats(idx, nb)[2]
    stream = REFERENCE.varint_encode(idx, nbytes)
    np.testing.assert_array_equal(FUSED.varint_encode(idx, nbytes), stream)
    for k in (REFERENCE, FUSED):
        with pytest.raises(KernelError):  # a wrong size is refused, never written past
            k.varint_encode(idx, nbytes - 1 if nbytes else 1)
    for k in (REFERENCE, FUSED):
        np.testing.assert_array_equal(k.varint_decode(stream, idx.shape[0], nb), idx)
    if nb <= 1 << 16:
        bitmap = REFERENCE.bitmap_encode(idx, nb)
        np.testing.assert_array_equal(FUSED.bitmap_encode(idx, nb), bitmap)
        for k in (REFERENCE, FUSED):
            np.testing.assert_array_equal(k.bitmap_decode(bitmap, idx.shape[0]), idx)


@settings(max_examples=300, deadline=None)
@given(stream=st.binary(max_size=24), count=st.integers(0, 24), nb=st.integers(1, 2**20))
def test_fused_varint_decode_accepts_exactly_what_reference_accepts(
    stream: bytes, count: int, nb: int
) -> None:
    b = np.frombuffer(stream, dtype=np.uint8)
    count = min(count, b.shape[0])
    results = []
    for k in (REFERENCE, FUSED):
        try:
            results.append(k.varint_decode(b, count, nb).tolist())
        except MalformedPayload:
            results.append(None)
    if results[0] is not None and any(x >= y for x, y in zip(results[0], results[0][1:], strict=False)):
        results[0] = (
            None  # the reference leaves a wrapped prefix sum to validate(); the fused loop cannot wrap
        )
    assert results[0] == results[1]


@settings(max_examples=200, deadline=None)
@given(stream=st.binary(max_size=16), count=st.integers(0, 130), honest=st.booleans())
def test_fused_bitmap_decode_agrees_with_reference(stream: bytes, count: int, honest: bool) -> None:
    b = np.frombuffer(stream, dtype=np.uint8)
    count = int(np.bitwise_count(b).sum()) if honest else min(count, 8 * b.shape[0])
    results = []
    for k in (REFERENCE, FUSED):
        try:
            results.append(k.bitmap_decode(b, count).tolist())
        except MalformedPayload:
            results.append(None)
    assert results[0] == results[1]


def f32_patterns() -> npt.NDArray[np.float32]:
    """Random bit patterns plus every boundary of fp16 and bf16 rounding and range."""
    rng = np.random.default_rng(7)
    edges = np.array(
        [
            0,
            0x80000000,
            0x7F800000,
            0xFF800000,
            0x7FC00000,
            0x7F800001,
            0xFFFFFFFF,
            0x477FE000,
            0x477FEFFF,
            0x477FF000,
            0x477FF001,
            0x47800000,
            0x38800000,
            0x387FFFFF,
            0x33000000,
            0x33000001,
            0x32FFFFFF,
            0x3F808000,
            0x3F818000,
            0x7F7FFFFF,
            0x00000001,
        ],
        dtype=np.uint32,
    )
    near = (np.arange(-40, 40, dtype=np.int64)[:, None] + edges.astype(np.int64)[None, :]) % 2**32
    rand = rng.integers(0, 2**32, 200_000, dtype=np.uint64)
    return np.concatenate([edges, near.ravel(), rand]).astype(np.uint32).view(np.float32)


def test_fused_casts_match_numpy_bit_for_bit() -> None:
    x = f32_patterns()
    with np.errstate(over="ignore"):
        want16 = x.astype(np.float16)
    got16, over = FUSED.f32_to_f16(x)
    _, ref_over = REFERENCE.f32_to_f16(x)
    assert over and ref_over  # the patterns include finite values above 65520
    nan = np.isnan(x)
    np.testing.assert_array_equal(np.isnan(got16), nan)
    np.testing.assert_array_equal(got16.view(np.uint16)[~nan], want16.view(np.uint16)[~nan])
    np.testing.assert_array_equal(FUSED.f32_to_bf16(x), fp32_to_bf16(x))
    np.testing.assert_array_equal(REFERENCE.f32_to_bf16(x), fp32_to_bf16(x))
    small = x[np.isfinite(x) & (np.abs(x) < 65504)]
    (a, a_over), (b, b_over) = FUSED.f32_to_f16(small), REFERENCE.f32_to_f16(small)
    assert not a_over and not b_over
    np.testing.assert_array_equal(a.view(np.uint16), b.view(np.uint16))
