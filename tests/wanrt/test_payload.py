import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from wanrt.errors import MalformedPayload
from wanrt.payload import SparsePayload, bf16_to_fp32, fp32_to_bf16, n_blocks


@given(
    dense_len=st.integers(0, 300),
    block_size=st.sampled_from([1, 4, 16]),
    data=st.data(),
)
def test_blocks_roundtrip_through_dense(dense_len: int, block_size: int, data: st.DataObject) -> None:
    rng = np.random.default_rng(dense_len * 31 + block_size)
    dense = rng.standard_normal(dense_len).astype(np.float32)
    nb = n_blocks(dense_len, block_size)
    chosen = sorted(data.draw(st.sets(st.integers(0, max(nb - 1, 0)), max_size=nb))) if nb else []
    p = SparsePayload.from_dense_blocks(3, dense, np.array(chosen, dtype=np.int64), block_size)
    p.validate()
    out = p.to_dense()
    mask = np.zeros(nb * block_size, dtype=bool)
    for b in chosen:
        mask[b * block_size : (b + 1) * block_size] = True
    mask = mask[:dense_len]
    np.testing.assert_array_equal(out[mask], dense[mask])
    assert not np.any(out[~mask])


def _p(indices: list[int], values: list[float], dense_len: int = 40, bs: int = 16) -> SparsePayload:
    return SparsePayload(0, dense_len, bs, np.array(indices, dtype=np.int64), np.array(values, np.float32))


@pytest.mark.parametrize(
    "payload",
    [
        _p([3], [1.0] * 16),  # out of range (40 elems -> 3 blocks)
        _p([1, 0], [1.0] * 32),  # unsorted
        _p([1, 1], [1.0] * 32),  # duplicate
        _p([1], [1.0] * 15),  # count mismatch
        _p([2], [1.0] * 16),  # nonzero padding beyond dense_len in tail block
    ],
)
def test_lying_payloads_are_rejected(payload: SparsePayload) -> None:
    with pytest.raises(MalformedPayload):
        payload.validate(peer="evil")


def test_bf16_rounding() -> None:
    x = np.array([1.0, -2.5, 3.14159, 1e-30, np.inf], dtype=np.float32)
    back = bf16_to_fp32(fp32_to_bf16(x))
    np.testing.assert_allclose(back[:4], x[:4], rtol=2**-8)
    assert np.isinf(back[4])
    assert np.isnan(bf16_to_fp32(fp32_to_bf16(np.array([np.nan], np.float32))))[0]


def test_is_finite_remembers_only_read_only_finite_payloads() -> None:
    values = np.ones(16, dtype=np.float32)
    p = SparsePayload(0, 16, 16, np.array([0], dtype=np.int64), values)
    assert p.is_finite()
    values[3] = np.inf  # writable: never remembered, so the change is seen
    assert not p.is_finite()
    ro = SparsePayload(0, 16, 16, np.array([0], dtype=np.int64), np.ones(16, dtype=np.float32))
    ro.values.flags.writeable = False
    ro.indices.flags.writeable = False
    assert ro.is_finite() and ro.is_finite()
    bad = np.full(16, np.nan, dtype=np.float32)
    bad.flags.writeable = False
    idx = np.array([0], dtype=np.int64)
    idx.flags.writeable = False
    assert not SparsePayload(0, 16, 16, idx, bad).is_finite()
    assert ro.is_finite()


def test_is_finite_of_16_bit_values_agrees_with_numpy_on_every_bit_pattern() -> None:
    patterns = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    fp16 = patterns.view(np.float16)
    bf16_finite = np.isfinite((patterns.astype(np.uint32) << 16).view(np.float32))
    for blk in range(0, 1 << 16, 16):
        sl = slice(blk, blk + 16)
        p = SparsePayload(0, 16, 16, np.array([0]), fp16[sl].copy(), "fp16")
        assert p.is_finite() == bool(np.isfinite(fp16[sl]).all())
        b = SparsePayload(0, 16, 16, np.array([0]), patterns[sl].copy(), "bf16")
        assert b.is_finite() == bool(bf16_finite[sl].all())
    assert SparsePayload.empty(0, 16, 16, "fp16").is_finite()


def test_validated_says_validate_passed_on_this_object() -> None:
    """``validated`` (what lets a GPU step skip its own index check) is set by a passing validate only."""
    from wanrt.codec.payload_codec import decode_payload, encode_payload

    good = SparsePayload(0, 40, 16, np.array([0, 2]), np.zeros(32, np.float32))
    assert not good.validated  # unknown until checked
    good.validate()
    assert good.validated
    bad = SparsePayload(0, 40, 16, np.array([2, 1]), np.zeros(32, np.float32))
    with pytest.raises(MalformedPayload):
        bad.validate()
    assert not bad.validated
    meta, bufs = encode_payload(SparsePayload(1, 40, 16, np.array([1]), np.ones(16, np.float32)))
    decoded = decode_payload(meta, [bytes(b) for b in bufs])
    assert decoded.validated  # the codec validates all it decodes
    copy = SparsePayload(1, 40, 16, decoded.indices.copy(), np.zeros(16, np.float32))
    assert copy.carry_validation(decoded).validated  # a rebuilt payload with the same indices
    other = SparsePayload(1, 48, 16, decoded.indices.copy(), np.zeros(16, np.float32))
    assert not other.carry_validation(decoded).validated  # another shape: not carried
    assert not dataclasses.replace(decoded, indices=np.array([2])).validated  # replace never copies it
