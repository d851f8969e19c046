"""Sparse aggregation is exact, and bounded forwarding never loses mass."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gateways.rounds.aggregate as agg
from gateways.rounds.aggregate import (
    aggregate,
    aggregate_cap,
    concat_segments,
    per_site_cap,
    segment_bounds,
    split_segments,
    top_blocks,
)
from wanrt.errors import MalformedPayload
from wanrt.payload import SparsePayload, fp32_to_bf16, n_blocks


def _payload(
    rng: np.random.Generator, dense_len: int, bs: int, density: float, dtype: str = "fp32", layer: int = 0
) -> SparsePayload:
    nb = n_blocks(dense_len, bs)
    idx = np.flatnonzero(rng.random(nb) < density).astype(np.int64)
    dense = rng.integers(-8, 9, size=dense_len).astype(np.float32)  # small integers: exact in fp16/bf16
    p = SparsePayload.from_dense_blocks(layer, dense, idx, bs)
    if dtype == "fp16":
        return SparsePayload(layer, dense_len, bs, p.indices, p.values.astype(np.float16), "fp16")
    if dtype == "bf16":
        return SparsePayload(layer, dense_len, bs, p.indices, fp32_to_bf16(p.values), "bf16")
    return p


def _dense_sum(ps: list[SparsePayload], dense_len: int) -> np.ndarray:
    out = np.zeros(dense_len, np.float32)
    for p in ps:
        p.add_into(out)
    return out


@settings(max_examples=60, deadline=None)
@given(
    dense_len=st.integers(1, 400),
    bs=st.sampled_from([1, 4, 16]),
    k=st.integers(0, 6),
    density=st.floats(0.0, 1.0),
    dtype=st.sampled_from(["fp32", "fp16", "bf16"]),
    seed=st.integers(0, 2**31),
)
def test_aggregate_equals_dense_sum(
    dense_len: int, bs: int, k: int, density: float, dtype: str, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    ps = [_payload(rng, dense_len, bs, density, dtype) for _ in range(k)]
    out = aggregate(ps)
    if k == 0:
        assert out is None
        return
    assert out is not None
    out.validate()
    assert out.value_dtype == "fp32"
    np.testing.assert_array_equal(out.to_dense(), _dense_sum(ps, dense_len))
    union = np.unique(np.concatenate([p.indices for p in ps])) if ps else np.zeros(0, np.int64)
    np.testing.assert_array_equal(out.indices, union)  # the union of indices, even where values cancel


@pytest.mark.parametrize("density", [0.005, 0.3, 0.9])
def test_merge_and_scratch_paths_are_bit_identical(monkeypatch: pytest.MonkeyPatch, density: float) -> None:
    rng = np.random.default_rng(7)
    ps = []
    for _ in range(5):
        p = _payload(rng, 5000, 16, density)
        ps.append(SparsePayload(0, 5000, 16, p.indices, rng.standard_normal(p.nnz).astype(np.float32)))
    monkeypatch.setattr(agg, "_DENSE_SCRATCH_FACTOR", 0)
    merged = aggregate(ps)
    monkeypatch.setattr(agg, "_DENSE_SCRATCH_FACTOR", 10**9)
    scratch = aggregate(ps)
    assert merged is not None and scratch is not None
    np.testing.assert_array_equal(merged.indices, scratch.indices)
    assert merged.values.tobytes() == scratch.values.tobytes()
    # and both add in input order: ((a + b) + c) ...
    ref = np.zeros(5000 // 16 * 16 + 16, np.float32).reshape(-1, 16)
    for p in ps:
        ref[p.indices] += p.values.reshape(-1, 16)
    assert ref[merged.indices].reshape(-1).tobytes() == merged.values.tobytes()


def test_shape_mismatch_names_the_peer() -> None:
    a = SparsePayload.empty(3, 100, 16)
    b = SparsePayload(3, 100, 4, np.array([0], np.int64), np.ones(4, np.float32))
    with pytest.raises(MalformedPayload) as err:
        aggregate([a, b], peers=["site-a", "site-b"])
    assert err.value.fields["peer"] == "site-b"
    with pytest.raises(MalformedPayload):
        aggregate([a, SparsePayload.empty(4, 100, 16)])


def test_none_and_empty_inputs() -> None:
    assert aggregate([None, None]) is None
    out = aggregate([None, SparsePayload.empty(1, 10, 4)])
    assert out is not None and out.nnz_blocks == 0 and out.dense_len == 10


@settings(max_examples=60, deadline=None)
@given(
    dense_len=st.integers(1, 300),
    bs=st.sampled_from([1, 4, 16]),
    cap=st.integers(0, 40),
    seed=st.integers(0, 2**31),
)
def test_top_blocks_splits_exactly(dense_len: int, bs: int, cap: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    p = _payload(rng, dense_len, bs, 0.5)
    kept, rest = top_blocks(p, cap)
    kept.validate()
    rest.validate()
    assert kept.nnz_blocks == min(cap, p.nnz_blocks)
    assert not set(kept.indices.tolist()) & set(rest.indices.tolist())
    np.testing.assert_array_equal(kept.to_dense() + rest.to_dense(), p.to_dense())
    if kept.nnz_blocks and rest.nnz_blocks:
        mag = lambda q: np.abs(q.values.reshape(-1, bs)).sum(axis=1)  # noqa: E731
        assert mag(kept).min() >= mag(rest).max()


@settings(max_examples=40, deadline=None)
@given(
    rounds=st.integers(1, 12),
    sites=st.integers(1, 5),
    density=st.floats(0.05, 0.5),
    policy=st.sampled_from(["per_site", "cap"]),
    seed=st.integers(0, 2**31),
)
def test_forwarded_plus_residual_equals_inputs(
    rounds: int, sites: int, density: float, policy: str, seed: int
) -> None:
    """The gateway's error feedback: what is not forwarded this round is added to the next one."""
    rng = np.random.default_rng(seed)
    dense_len, bs = 500, 4
    residual: SparsePayload | None = None
    inputs = np.zeros(dense_len, np.float32)
    forwarded = np.zeros(dense_len, np.float32)
    for _ in range(rounds):
        ps = [_payload(rng, dense_len, bs, 0.4) for _ in range(sites)]
        for p in ps:
            p.add_into(inputs)
        total = aggregate([*ps, residual])
        assert total is not None
        if policy == "per_site":
            cap = per_site_cap(dense_len, bs, density, sites) * sites
        else:
            cap = aggregate_cap(dense_len, bs, density)
        kept, residual = top_blocks(total, cap)
        assert kept.nnz_blocks <= cap
        kept.add_into(forwarded)
    assert residual is not None
    np.testing.assert_array_equal(forwarded + residual.to_dense(), inputs)


def test_caps() -> None:
    assert per_site_cap(1600, 16, 0.01, 4) == 1  # k = 1 block, split over 4 sites: at least one each
    assert per_site_cap(160_000, 16, 0.01, 4) == 25
    assert aggregate_cap(160_000, 16, 0.01) == 100
    assert aggregate_cap(10, 16, 0.01) == 1


@given(total=st.integers(0, 1000), n=st.integers(1, 40), seed=st.integers(0, 2**31))
def test_segments_roundtrip(total: int, n: int, seed: int) -> None:
    bounds = segment_bounds(total, n)
    assert bounds[0] == 0 and bounds[-1] == total and np.all(np.diff(bounds) >= 0)
    assert np.diff(bounds).max() - np.diff(bounds).min() <= 1
    if total == 0:
        return
    p = _payload(np.random.default_rng(seed), total * 4, 4, 0.3)
    parts = split_segments(p, bounds)
    for g, q in enumerate(parts):
        q.validate()
        assert np.all((q.indices >= bounds[g]) & (q.indices < bounds[g + 1]))
    joined = concat_segments(parts)
    np.testing.assert_array_equal(joined.indices, p.indices)
    np.testing.assert_array_equal(joined.values, p.values)


def _general(monkeypatch: pytest.MonkeyPatch, ps: list[SparsePayload], scratch: bool) -> SparsePayload:
    """The sum by the sparse paths (dense detection off): merge (``scratch`` False) or scratch."""
    monkeypatch.setattr(agg, "_same_full_range", lambda _: False)
    monkeypatch.setattr(agg, "_DENSE_SCRATCH_FACTOR", 10**9 if scratch else 0)
    out = aggregate(ps)
    monkeypatch.undo()
    assert out is not None
    return out


def _signed(rng: np.random.Generator, n: int) -> np.ndarray:
    """Arbitrary fp32 values, with signed zeros and magnitudes whose sums round differently by order."""
    v = (rng.standard_normal(n) * 10.0 ** rng.integers(-6, 4, n)).astype(np.float32)  # finite in fp16
    v[rng.random(n) < 0.1] = -0.0
    v[rng.random(n) < 0.05] = 0.0
    return v


@settings(max_examples=60, deadline=None)
@given(
    dense_len=st.integers(1, 300),
    bs=st.sampled_from([1, 4, 16]),
    k=st.integers(2, 6),
    dtype=st.sampled_from(["fp32", "fp16", "bf16"]),
    segment=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_dense_inputs_add_as_vectors_bit_identical_to_the_sparse_paths(
    dense_len: int, bs: int, k: int, dtype: str, segment: bool, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    nb = n_blocks(dense_len, bs)
    lo, hi = (0, nb) if not segment else sorted(rng.integers(0, nb + 1, 2).tolist())
    if hi == lo:
        hi = lo + 1 if lo < nb else lo
        lo = hi - 1
    idx = np.arange(lo, hi, dtype=np.int64)
    ps = []
    for _ in range(k):
        dense = _signed(rng, dense_len)
        p = SparsePayload.from_dense_blocks(0, dense, idx, bs)
        if dtype == "fp16":
            p = SparsePayload(0, dense_len, bs, p.indices, p.values.astype(np.float16), "fp16")
        elif dtype == "bf16":
            p = SparsePayload(0, dense_len, bs, p.indices, fp32_to_bf16(p.values), "bf16")
        ps.append(p)
    mp = pytest.MonkeyPatch()
    out = aggregate(ps)
    assert out is not None and agg._same_full_range(ps)
    out.validate()
    for scratch in (False, True):
        ref = _general(mp, ps, scratch)
        np.testing.assert_array_equal(out.indices, ref.indices)
        assert out.values.tobytes() == ref.values.tobytes()  # signed zeros included
    assert np.shares_memory(out.indices, ps[0].indices)  # indices reused, not rebuilt


def test_dense_detection_is_exact() -> None:
    full = SparsePayload(0, 64, 16, np.arange(4, dtype=np.int64), np.ones(64, np.float32))
    gap = SparsePayload(0, 64, 16, np.array([0, 1, 3], np.int64), np.ones(48, np.float32))
    other = SparsePayload(0, 64, 16, np.arange(1, 4, dtype=np.int64), np.ones(48, np.float32))
    assert agg._same_full_range([full, full])
    assert not agg._same_full_range([full, gap])  # same count would need the same ends
    assert not agg._same_full_range([gap, gap])  # not contiguous
    assert not agg._same_full_range([other, gap])
    out = aggregate([full, gap])
    assert out is not None
    np.testing.assert_array_equal(out.to_dense(), full.to_dense() + gap.to_dense())


def test_keep_dtype_passes_a_lone_input_through() -> None:
    p = SparsePayload(0, 64, 16, np.arange(2, dtype=np.int64), np.ones(32, np.float16), "fp16")
    assert aggregate([p, None], keep_dtype=True) is p
    assert aggregate([p]).value_dtype == "fp32"  # type: ignore[union-attr]
    parts = split_segments(p, segment_bounds(4, 2), keep_dtype=True)
    assert [q.value_dtype for q in parts] == ["fp16", "fp16"] and np.shares_memory(parts[0].values, p.values)
    joined = concat_segments(parts)  # fp16 segments join in fp16; an empty part does not widen them
    assert joined.value_dtype == "fp16" and joined.values.tobytes() == p.values.tobytes()
    mixed = concat_segments([parts[0], SparsePayload.empty(0, 64, 16)])
    assert mixed.value_dtype == "fp16"


def test_merge_and_scratch_paths_agree_on_signed_zeros(monkeypatch: pytest.MonkeyPatch) -> None:
    a = SparsePayload(0, 32, 16, np.array([0, 1], np.int64), np.full(32, -0.0, np.float32))
    b = SparsePayload(0, 32, 16, np.array([1], np.int64), np.full(16, -0.0, np.float32))
    monkeypatch.setattr(agg, "_DENSE_SCRATCH_FACTOR", 0)
    merged = aggregate([a, b])
    monkeypatch.setattr(agg, "_DENSE_SCRATCH_FACTOR", 10**9)
    scratch = aggregate([a, b])
    assert merged is not None and scratch is not None
    assert merged.values.tobytes() == scratch.values.tobytes()
    assert np.signbit(scratch.values).all()  # -0.0 + -0.0 is -0.0, as IEEE addition says


@settings(max_examples=60, deadline=None)
@given(
    k=st.integers(2, 5),
    cut=st.integers(1, 4),
    density=st.floats(0.0, 1.0),
    dtype=st.sampled_from(["fp32", "fp16"]),
    seed=st.integers(0, 2**31),
)
def test_summing_a_prefix_first_gives_the_same_bits(
    k: int, cut: int, density: float, dtype: str, seed: int
) -> None:
    """What the all-pairs owner relies on to add slices as they arrive: aggregate(prefix) + the rest, one
    at a time, equals aggregate(all) bit for bit (signed zeros included), whatever paths are taken."""
    rng = np.random.default_rng(seed)
    ps: list[SparsePayload | None] = []
    for _ in range(k):
        if rng.random() < 0.15:
            ps.append(None)
            continue
        p = _payload(rng, 400, 16, density, dtype)
        vals = _signed(rng, p.nnz)
        ps.append(SparsePayload(0, 400, 16, p.indices, vals.astype(p.values.dtype), dtype))
    whole = aggregate(ps)
    acc = aggregate(ps[: min(cut, k)])
    for p in ps[min(cut, k) :]:
        acc = aggregate([acc, p])
    if whole is None:
        assert acc is None
        return
    assert acc is not None
    np.testing.assert_array_equal(acc.indices, whole.indices)
    assert acc.values.tobytes() == whole.values.tobytes()
