"""Low-bit value codings (int8/int4/int2 + one scale byte per group): error bounds, exact relays, sizes,
and a decoder that trusts nothing."""

from __future__ import annotations

import dataclasses
from decimal import Decimal, getcontext

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wanrt.codec import decode_payload, encode_payload
from wanrt.codec.lowbit import (
    _FRAC,
    CODING_BITS,
    VALUE_CODINGS,
    ZERO_GROUP,
    LowbitValues,
    coded_size,
    dequantise,
    pack,
    quantise,
    quantise_payload,
    unpack,
    usable_coded,
)
from wanrt.codec.negotiation import VALUE_CODINGS_KEY, check_value_coding, offered_codings
from wanrt.codec.value_casts import in_wire_dtype
from wanrt.errors import MalformedPayload, RemoteProtocolError, UnsupportedValueCoding
from wanrt.payload import SparsePayload, n_blocks


def random_payload(
    rng: np.random.Generator, dense_len: int, bs: int, density: float, scale: float = 1e-3
) -> SparsePayload:
    nb = n_blocks(dense_len, bs)
    k = max(1, int(nb * density))
    idx = np.sort(rng.choice(nb, size=k, replace=False)).astype(np.int64)
    dense = (rng.standard_normal(dense_len) * scale).astype(np.float32)
    return SparsePayload.from_dense_blocks(7, dense, idx, bs)


def steps_of(lv: LowbitValues) -> np.ndarray:
    k = lv.scales.astype(np.int64)
    s = np.ldexp(_FRAC[k % 8].astype(np.float64), lv.exponent - k // 8)
    s[lv.scales == ZERO_GROUP] = 0
    return s


def wire(meta: dict[str, object], buffers: list[memoryview]) -> list[bytes]:
    return [bytes(b) for b in buffers]


def test_step_constants_are_two_to_minus_j_eighths_correctly_rounded() -> None:
    getcontext().prec = 50
    for j in range(8):
        exact = Decimal(2) ** (Decimal(-j) / 8)
        assert float(_FRAC[j]) == float(np.float32(float(exact)))


@pytest.mark.parametrize("coding", VALUE_CODINGS)
@pytest.mark.parametrize("bs", [16, 1, 7])
def test_error_is_at_most_half_a_step_and_decode_is_exactly_what_the_sender_kept(
    coding: str, bs: int
) -> None:
    rng = np.random.default_rng(CODING_BITS[coding] * 100 + bs)
    p = random_payload(rng, 4001, bs, 0.05)
    q = quantise_payload(p, coding)
    lv = usable_coded(q)
    assert lv is not None and lv.coding == coding and q.value_dtype == "fp32"
    steps = np.repeat(steps_of(lv), lv.scale_block)[: p.nnz]
    err = np.abs(q.values.astype(np.float64) - p.values.astype(np.float64))
    assert np.all(err <= steps / 2 * (1 + 2**-20) + 1e-45)
    meta, buffers = encode_payload(q)
    assert meta["dtype"] == coding
    assert len(buffers[0]) == coded_size(p.nnz, coding, 16)
    d = decode_payload(meta, wire(meta, buffers))
    np.testing.assert_array_equal(d.values, q.values)  # bit for bit: the residual accounted for these
    np.testing.assert_array_equal(d.indices, p.indices)


@pytest.mark.parametrize("coding", VALUE_CODINGS)
def test_a_relay_sends_the_very_same_bytes(coding: str) -> None:
    p = quantise_payload(random_payload(np.random.default_rng(3), 10_000, 16, 0.02), coding)
    meta, buffers = encode_payload(p)
    d = decode_payload(meta, wire(meta, buffers))
    meta2, buffers2 = encode_payload(d)  # a gateway passing a contribution on unchanged
    assert meta2 == meta and wire(meta2, buffers2) == wire(meta, buffers)


def test_bytes_per_selected_element_at_one_percent_meet_issue_23() -> None:
    """25 M elements, block 16, 1 % of the blocks: index (varint) included, as the issue's targets say."""
    rng = np.random.default_rng(0)
    nb = 25_000_000 // 16
    idx = np.sort(rng.choice(nb, size=nb // 100, replace=False)).astype(np.int64)
    p = SparsePayload(0, 25_000_000, 16, idx, (rng.standard_normal(idx.size * 16) * 1e-3).astype(np.float32))
    per = {}
    for coding, target in (("int8", 1.15), ("int4", 0.65), ("int2", 0.40)):
        _, buffers = encode_payload(quantise_payload(p, coding))
        per[coding] = sum(len(b) for b in buffers) / p.nnz
        assert per[coding] <= target, (coding, per[coding])
    assert per["int8"] - per["int4"] == pytest.approx(0.5, abs=1e-4)


@settings(deadline=None, max_examples=100)
@given(
    coding=st.sampled_from(VALUE_CODINGS),
    scale=st.sampled_from([1e-30, 1e-6, 1.0, 1e20]),
    seed=st.integers(0, 2**31),
)
def test_the_scale_code_is_canonical(coding: str, scale: float, seed: int) -> None:
    """Each group's code is the largest whose step holds it (or 255): the same on every host and path."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(160) * rng.choice([1.0, 1e-3, 1e-12], size=160) * scale).astype(np.float32)
    lv = quantise(x, coding, 16)
    assert lv is not None
    need = np.abs(x.astype(np.float64)).reshape(-1, 16).max(axis=1) / (2 ** (CODING_BITS[coding] - 1) - 0.5)
    k = lv.scales.astype(np.int64)
    step = np.ldexp(_FRAC[k % 8].astype(np.float64), lv.exponent - k // 8)
    nxt = np.ldexp(_FRAC[(k + 1) % 8].astype(np.float64), lv.exponent - (k + 1) // 8)
    real = lv.scales != ZERO_GROUP
    assert np.all(step[real] >= need[real])
    assert np.all(nxt[real] < need[real])  # (code 255's step counts as a step: below it, a zero group)
    assert np.all(need[~real] <= np.ldexp(np.float64(_FRAC[7]), lv.exponent - 31))


def test_zero_and_tiny_groups_are_zero_groups() -> None:
    x = np.zeros(48, np.float32)
    x[16:32] = 1.0
    x[32:48] = 1e-20  # far below the largest group's step grid (31.75 octaves)
    lv = quantise(x, "int8", 16)
    assert lv is not None
    assert lv.scales[0] == ZERO_GROUP and lv.scales[2] == ZERO_GROUP
    step = steps_of(lv)[1]
    assert 1.0 / 127.5 <= step < 1.0 / 127.5 * 2 ** (1 / 8)  # the smallest grid step that holds the group
    y = dequantise(lv)
    assert not np.any(y[:16]) and not np.any(y[32:])
    np.testing.assert_allclose(y[16:32], 1.0, rtol=2**-7)


def test_tail_padding_stays_zero() -> None:
    dense = np.full(20, 0.5, np.float32)
    p = SparsePayload.from_dense_blocks(0, dense, np.array([0, 1], np.int64), 16)
    for coding in VALUE_CODINGS:
        q = quantise_payload(p, coding)
        q.validate()
        assert not np.any(q.values[20:])
        d = decode_payload(*_encoded(q))
        d.validate()
        assert not np.any(d.values[20:])


def _encoded(p: SparsePayload) -> tuple[dict[str, object], list[bytes]]:
    meta, buffers = encode_payload(p)
    return meta, wire(meta, buffers)


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan, 1e31])
def test_values_that_cannot_be_coded_go_in_fp32(bad: float) -> None:
    p = random_payload(np.random.default_rng(4), 320, 16, 0.5)
    vals = p.values.copy()
    vals[5] = bad
    p = dataclasses.replace(p, values=vals)
    assert quantise_payload(p, "int4") is p
    meta, _ = encode_payload(p, wire_dtype="int4")
    assert meta["dtype"] == "fp32"


def test_stale_codes_are_never_sent() -> None:
    """A payload rebuilt with other values keeps ``coded`` (dataclasses.replace) but is quantised afresh."""
    q = quantise_payload(random_payload(np.random.default_rng(5), 640, 16, 0.5), "int8")
    other = dataclasses.replace(q, values=q.values * np.float32(2))
    assert usable_coded(other) is None
    d = decode_payload(*_encoded(dataclasses.replace(other)))  # default dtype: fp32, its own
    np.testing.assert_array_equal(d.values, other.values)
    meta, buffers = encode_payload(other, wire_dtype="int8")
    d8 = decode_payload(meta, wire(meta, buffers))
    np.testing.assert_allclose(d8.values, other.values, atol=float(np.abs(other.values).max()) / 100)


def test_in_wire_dtype_keeps_the_callers_codes() -> None:
    p = random_payload(np.random.default_rng(6), 640, 16, 0.5)
    q = quantise_payload(p, "int2")
    assert in_wire_dtype(q, "int2") is q
    fresh = in_wire_dtype(p, "int2")
    assert usable_coded(fresh) is not None
    np.testing.assert_array_equal(fresh.values, q.values)  # deterministic


@pytest.mark.parametrize("coding", VALUE_CODINGS)
def test_pack_unpack_round_trip(coding: str) -> None:
    rng = np.random.default_rng(7)
    for n in (0, 1, 3, 16, 17, 33):
        lv = quantise((rng.standard_normal(n)).astype(np.float32), coding, 5)
        assert lv is not None
        buf = pack(lv)
        assert buf.shape[0] == coded_size(n, coding, 5)
        back = unpack(memoryview(buf.tobytes()), coding, n)
        np.testing.assert_array_equal(back.codes, lv.codes)
        np.testing.assert_array_equal(back.scales, lv.scales)
        assert (back.exponent, back.scale_block) == (lv.exponent, lv.scale_block)


def _mutated(buf: bytes, at: int, value: int) -> bytes:
    b = bytearray(buf)
    b[at] = value
    return bytes(b)


def test_decoder_refuses_inconsistent_buffers() -> None:
    q = quantise_payload(random_payload(np.random.default_rng(8), 400, 16, 0.3), "int2")
    meta, (values, index) = _encoded(q)
    with pytest.raises(MalformedPayload, match="length"):
        decode_payload(meta, [values[:-1], index])
    with pytest.raises(MalformedPayload, match="shorter than its header"):
        decode_payload(dict(meta, count=0), [values[:3], b""])
    with pytest.raises(MalformedPayload, match="reserved"):
        decode_payload(meta, [_mutated(values, 6, 1), index])
    with pytest.raises(MalformedPayload, match="scale block"):
        decode_payload(meta, [_mutated(_mutated(values, 4, 0), 5, 0), index])
    with pytest.raises(MalformedPayload, match="exponent"):
        decode_payload(meta, [_mutated(values, 3, 0x7F), index])
    # 2-bit codes of an odd count: the unused lanes of the last byte must be zero
    five = SparsePayload(0, 5, 1, np.arange(5, dtype=np.int64), np.ones(5, np.float32))
    odd = quantise_payload(five, "int2")
    m2, (v2, i2) = _encoded(odd)
    with pytest.raises(MalformedPayload, match="beyond the last value"):
        decode_payload(m2, [_mutated(v2, len(v2) - 1, v2[-1] | 0xC0), i2])
    with pytest.raises(MalformedPayload, match="dtype"):
        decode_payload(dict(meta, dtype="int3"), [values, index])


@settings(deadline=None, max_examples=150)
@given(data=st.data())
def test_random_corruption_decodes_or_raises_a_remote_error(data: st.DataObject) -> None:
    coding = data.draw(st.sampled_from(VALUE_CODINGS))
    q = quantise_payload(random_payload(np.random.default_rng(9), 300, 16, 0.3), coding)
    meta, (values, index) = _encoded(q)
    b = bytearray(values)
    for _ in range(data.draw(st.integers(1, 4))):
        b[data.draw(st.integers(0, len(b) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, 3))
    try:
        d = decode_payload(meta, [bytes(b[: len(b) - cut]), index])
    except RemoteProtocolError:
        return
    d.validate()
    assert d.values.dtype == np.float32 and np.isfinite(d.values).all()


def test_negotiation() -> None:
    offered = {VALUE_CODINGS_KEY: offered_codings()}
    for coding in ("fp32", "fp16", "bf16", *VALUE_CODINGS):
        check_value_coding(coding, offered)
    check_value_coding("fp16", {})  # floats need no agreement
    with pytest.raises(UnsupportedValueCoding) as info:
        check_value_coding("int4", {}, peer="gw")  # a gateway that predates low-bit values
    assert info.value.coding == "int4" and info.value.supported == () and info.value.peer == "gw"
    with pytest.raises(UnsupportedValueCoding, match="offers: int8"):
        check_value_coding("int2", {VALUE_CODINGS_KEY: "int8"})
