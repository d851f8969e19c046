"""Compressors: payload invariants, exact baselines, identical results on every path, input errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.wanrt.kernels.conftest import CPU_PATHS, FAST_PATHS, forced_path
from wanrt.errors import ConfigError, KernelError
from wanrt.kernels import COMPRESSOR_KINDS, CompressorConfig, ThresholdV, make_compressor
from wanrt.payload import SparsePayload, n_blocks


def _blocks_of(p: SparsePayload) -> set[int]:
    return set(p.indices.tolist())


def _gauss(seed: int, n: int, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * scale).astype(np.float32)


@pytest.mark.parametrize("kind", COMPRESSOR_KINDS)
@pytest.mark.parametrize("n", [1, 15, 16, 17, 1000, 40_003])
def test_payload_is_valid_and_holds_the_gradient_values(kind: str, n: int) -> None:
    g = _gauss(n, n)
    c = make_compressor(kind, density=0.05)
    for step in range(3):
        p = c.compress(7, g * np.float32(step + 1))
        p.validate()
        assert p.layer == 7 and p.dense_len == n and p.value_dtype == "fp32"
        assert 1 <= p.nnz_blocks <= c.targets(n).cap
        dense = p.to_dense()
        sel = dense != 0
        np.testing.assert_array_equal(dense[sel], (g * np.float32(step + 1))[sel])


def test_threshold_v_block_sends_exactly_the_top_k_blocks_once_settled() -> None:
    n = 200_000
    c = make_compressor("threshold_v_block", density=0.01)
    t = c.targets(n)
    assert t.k_block == 125 and t.cap == 125
    for step in range(6):
        g = _gauss(step, n)
        p = c.compress(0, g)
        sums = np.abs(g).reshape(-1, 16).sum(1)
        top = set(np.argsort(sums)[-t.k_block :].tolist())
        if step >= 2:  # after the first steps the pass count sits between k_block and the buffer
            assert _blocks_of(p) == top


def test_cap_keeps_the_largest_blocks_when_too_many_pass() -> None:
    n = 16 * 1000
    c = make_compressor("threshold_v_block", density=0.01)
    c.compress(0, _gauss(0, n))  # settles v for unit-scale gradients
    g = _gauss(1, n, 3.0)  # 3x larger: almost every block passes the old v
    p = c.compress(0, g)
    t = c.targets(n)
    assert p.nnz_blocks == t.cap
    sums = np.abs(g).reshape(-1, 16).sum(1)
    assert _blocks_of(p) == set(np.argsort(sums)[-t.cap :].tolist())


def test_nonzero_gradient_never_yields_an_empty_payload() -> None:
    n = 16 * 500
    c = make_compressor("threshold_v_block", density=0.01)
    c.compress(0, _gauss(0, n, 1e3))  # v settles for huge gradients
    g = np.zeros(n, np.float32)
    g[123] = 1e-30  # then one tiny nonzero element: nothing passes v
    p = c.compress(0, g)
    assert p.indices.tolist() == [123 // 16]
    assert p.to_dense()[123] == np.float32(1e-30)


def test_zero_gradient_gives_an_empty_payload() -> None:
    for kind in ("threshold_v_block", "threshold_v", "topk"):
        p = make_compressor(kind, density=0.1).compress(0, np.zeros(100, np.float32))
        p.validate()
        assert p.nnz_blocks == 0


def test_sparse_gradient_with_fewer_nonzero_blocks_than_k_sends_all_of_them() -> None:
    n = 16 * 1000
    c = make_compressor("threshold_v_block", density=0.1)  # k_block = 100
    g = np.zeros(n, np.float32)
    hot = [3, 50, 400, 999]
    for b in hot:
        g[b * 16 + 5] = 1.0
    for _ in range(3):
        assert c.compress(0, g).indices.tolist() == hot


def test_tail_block_is_zero_padded() -> None:
    n = 16 * 10 + 5
    g = np.zeros(n, np.float32)
    g[-5:] = 100.0  # the partial last block is the largest
    p = make_compressor("threshold_v_block", density=0.05).compress(0, g)
    p.validate()  # checks the padding is zero
    assert p.indices.tolist() == [10]
    np.testing.assert_array_equal(p.values, [100.0] * 5 + [0.0] * 11)


def test_topk_is_exact() -> None:
    g = _gauss(3, 10_000)
    p = make_compressor("topk", density=0.01).compress(0, g)
    assert _blocks_of(p) == set(np.argsort(np.abs(g))[-100:].tolist())
    pb = make_compressor("topk", density=0.01, block_size=16).compress(0, g)
    sums = np.abs(g).reshape(-1, 16).sum(1)
    assert _blocks_of(pb) == set(np.argsort(sums)[-7:].tolist())


def test_randomk_is_seeded_per_layer_and_reproducible() -> None:
    g = _gauss(4, 5000)
    a = make_compressor("randomk", density=0.02)
    b = make_compressor("randomk", density=0.02)
    pa, pb = a.compress(1, g), b.compress(1, g)
    assert pa.indices.tolist() == pb.indices.tolist() and pa.nnz_blocks == 100
    assert a.compress(2, g).indices.tolist() != pa.indices.tolist()  # another layer, another stream
    other = make_compressor("randomk", density=0.02, config=CompressorConfig(seed=9))
    assert other.compress(1, g).indices.tolist() != pa.indices.tolist()


@pytest.mark.parametrize("kind", ["threshold_v_block", "threshold_v", "topk"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nonfinite_gradient_is_a_kernel_error(kind: str, bad: float) -> None:
    c = make_compressor(kind, density=0.01)
    c.compress(0, _gauss(0, 4000))
    g = _gauss(1, 4000)
    g[17] = bad
    with pytest.raises(KernelError, match="NaN or infinite"):
        c.compress(0, g)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"kind": "top-k", "density": 0.1}, "kind"),
        ({"kind": "topk", "density": 0.0}, "density"),
        ({"kind": "topk", "density": 1.5}, "density"),
        ({"kind": "topk", "density": 0.1, "block_size": 0}, "block_size"),
        ({"kind": "threshold_v", "density": 0.1, "block_size": 16}, "block_size"),
    ],
)
def test_bad_arguments_are_config_errors_naming_the_key(kwargs: dict[str, object], key: str) -> None:
    kind = kwargs.pop("kind")
    with pytest.raises(ConfigError) as info:
        make_compressor(kind, **kwargs)  # type: ignore[arg-type]
    assert info.value.fields["key"] == key


def test_bad_config_values_are_rejected() -> None:
    with pytest.raises(ConfigError) as info:
        CompressorConfig(cap_factor=0.5)
    assert info.value.fields["key"] == "cap_factor"


@pytest.mark.parametrize(
    "grad",
    [np.ones((4, 4), np.float32), np.ones(8, np.float64), np.ones(16, np.float32)[::2], [1.0, 2.0]],
    ids=["2-D", "float64", "strided", "list"],
)
def test_gradients_that_would_need_a_copy_are_refused(grad: object) -> None:
    with pytest.raises(KernelError):
        make_compressor("threshold_v_block", density=0.1).compress(0, grad)


def test_torch_cpu_gradient_is_read_in_place() -> None:
    t = torch.randn(3000)
    p = make_compressor("threshold_v_block", density=0.05).compress(0, t)
    dense = p.to_dense()
    sel = dense != 0
    np.testing.assert_array_equal(dense[sel], t.numpy()[sel])


@pytest.mark.skipif(not FAST_PATHS, reason="no accelerated host path (numba missing)")
@pytest.mark.parametrize("kind", ["threshold_v_block", "threshold_v", "topk", "randomk"])
@settings(deadline=None, max_examples=25)
@given(
    n=st.integers(1, 3000),
    density=st.floats(0.001, 1.0),
    bs=st.sampled_from([None, 4, 16, 20]),
    seed=st.integers(0, 2**31),
    feedback=st.booleans(),
)
def test_every_path_produces_the_same_payloads(
    kind: str, n: int, density: float, bs: int | None, seed: int, feedback: bool
) -> None:
    from wanrt.kernels import ErrorFeedback

    if kind == "threshold_v":
        bs = None
    rng = np.random.default_rng(seed)
    grads = [(rng.standard_normal(n) * rng.choice([0.1, 1, 10])).astype(np.float32) for _ in range(4)]
    results = {}
    for path in CPU_PATHS:
        with forced_path(path):
            c = make_compressor(kind, density=density, block_size=bs)
            ef = ErrorFeedback()
            out = []
            for g in grads:
                p = ef.compress(0, g, c) if feedback else c.compress(0, g)
                out.append((p.indices.copy(), p.values.copy()))
            results[path] = (out, c.threshold(0) if isinstance(c, ThresholdV) else None)
    ref_out, ref_v = results["numpy"]
    for path in FAST_PATHS:
        out, v = results[path]
        assert v == ref_v
        for (i1, v1), (i2, v2) in zip(ref_out, out, strict=True):
            np.testing.assert_array_equal(i1, i2)
            np.testing.assert_array_equal(v1, v2)


def test_state_dict_round_trip_continues_identically() -> None:
    n = 20_000
    a = make_compressor("threshold_v_block", density=0.01)
    for s in range(3):
        a.compress(0, _gauss(s, n))
    assert isinstance(a, ThresholdV)
    b = make_compressor("threshold_v_block", density=0.01)
    b.load_state_dict(a.state_dict())
    g = _gauss(10, n)
    assert a.compress(0, g).indices.tolist() == b.compress(0, g).indices.tolist()
    assert a.threshold(0) == b.threshold(0)  # type: ignore[attr-defined]
    with pytest.raises(KernelError):
        b.load_state_dict({"layers": {0: {"v": -1.0, "dense_len": n}}})


def test_n_blocks_helper_agrees() -> None:
    assert make_compressor("threshold_v_block", density=1.0).targets(33).n_blocks == n_blocks(33, 16)


@pytest.mark.parametrize("path", CPU_PATHS)
def test_a_density_change_resizes_the_selection_buffers(path: str) -> None:
    """A scheduler may raise the density of a running job: the per-layer buffers sized for the old one
    must grow with it (they once stayed, and more passing blocks than they hold broke the selection)."""
    n = 16 * 160
    with forced_path(path):
        c = make_compressor("threshold_v_block", density=0.05)
        for step in range(3):
            c.compress(0, _gauss(step, n))
        c.density = 0.25
        for step in range(4):
            p = c.compress(0, _gauss(10 + step, n, 3.0))  # larger: more blocks pass the old v
            p.validate()
            assert 1 <= p.nnz_blocks <= c.targets(n).cap
        c.density = 0.01
        p = c.compress(0, _gauss(20, n))
        assert 1 <= p.nnz_blocks <= c.targets(n).cap
