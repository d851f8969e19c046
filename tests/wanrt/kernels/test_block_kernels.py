"""Every accelerated path against the NumPy reference, on random shapes, block sizes and thresholds.

Block sums are defined by a fixed halving-tree order, so the fused path must match the reference *bit for
bit* — the selections then agree even for a block sitting exactly on the threshold.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.wanrt.kernels.conftest import FAST_PATHS, random_update
from wanrt.errors import KernelError
from wanrt.kernels import kernels_by_name
from wanrt.payload import n_blocks

REF = kernels_by_name("numpy")
pytestmark = pytest.mark.skipif(not FAST_PATHS, reason="no accelerated host path (numba missing)")

sizes = st.integers(0, 700)
block_sizes = st.sampled_from([1, 2, 3, 16, 17, 32, 64])
seeds = st.integers(0, 2**32 - 1)


def _grad(seed: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    g = rng.standard_normal(n).astype(np.float32) * np.float32(rng.choice([1e-6, 1.0, 1e3]))
    g[rng.random(n) < 0.3] = 0  # exact zeros: zero blocks must never pass
    return g


@pytest.mark.parametrize("path", FAST_PATHS)
@settings(deadline=None, max_examples=60)
@given(n=sizes, bs=block_sizes, seed=seeds)
def test_block_sums_bit_identical(path: str, n: int, bs: int, seed: int) -> None:
    g = _grad(seed, n)
    np.testing.assert_array_equal(kernels_by_name(path).block_sums(g, bs), REF.block_sums(g, bs))


def test_block_sum_tree_order_is_the_documented_one() -> None:
    x = np.array([1e8, 1, 1, 1, 1, 1, 1, 1, -1e8, 1, 1, 1, 1, 1, 1, 1, 3], np.float32)
    # halving tree: |1e8|+|-1e8| pairs first, so the small ones survive rounding (a left fold would not)
    a = np.abs(x[:16])
    while a.shape[0] > 1:
        a = a[: a.shape[0] // 2] + a[a.shape[0] // 2 :]
    assert REF.block_sums(x, 16)[0] == a[0]
    assert REF.block_sums(x, 16)[1] == 3.0


@pytest.mark.parametrize("path", FAST_PATHS)
@settings(deadline=None, max_examples=80)
@given(n=sizes, bs=block_sizes, seed=seeds, q=st.floats(0.0, 1.0), cap=st.integers(1, 64), add=st.booleans())
def test_select_above_matches_reference(
    path: str, n: int, bs: int, seed: int, q: float, cap: int, add: bool
) -> None:
    g = _grad(seed, n)
    extra = _grad(seed + 1, n) if add else None
    sums = REF.block_sums(g + extra if extra is not None else g, bs)
    v = float(np.quantile(sums, q)) if n else 1.0
    v = max(v, float(np.finfo(np.float32).tiny))
    out = []
    for k in (REF, kernels_by_name(path)):
        x = g.copy()
        ib, sb = np.full(cap, -1, np.int64), np.full(cap, -1, np.float32)
        count, bad = k.select_above(x, v, bs, ib, sb, extra)
        out.append((count, bad, ib, sb, x))
    (c1, b1, i1, s1, x1), (c2, b2, i2, s2, x2) = out
    assert (c1, b1) == (c2, b2)
    np.testing.assert_array_equal(i1, i2)
    np.testing.assert_array_equal(s1, s2)
    np.testing.assert_array_equal(x1, x2)  # the error-feedback add happened identically
    expected = np.nonzero(sums >= np.float32(v))[0]
    assert c1 == expected.shape[0]
    m = min(c1, cap)
    np.testing.assert_array_equal(i1[:m], expected[:m])


@pytest.mark.parametrize("path", [*FAST_PATHS, "numpy"])
@pytest.mark.parametrize("bad_value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("bs", [1, 16, 5])
def test_select_flags_nonfinite(path: str, bad_value: float, bs: int) -> None:
    g = np.ones(100, np.float32)
    g[37] = bad_value
    ib, sb = np.empty(200, np.int64), np.empty(200, np.float32)
    _, bad = kernels_by_name(path).select_above(g, 1e30, bs, ib, sb)
    assert bad


@pytest.mark.parametrize("path", FAST_PATHS)
@settings(deadline=None, max_examples=60)
@given(n=st.integers(1, 500), bs=block_sizes, seed=seeds, frac=st.floats(0.0, 1.0))
def test_gather_zero_scatter_match_reference(path: str, n: int, bs: int, seed: int, frac: float) -> None:
    rng = np.random.default_rng(seed)
    g = _grad(seed, n)
    upd = random_update(rng, n, bs, frac)
    fast = kernels_by_name(path)
    np.testing.assert_array_equal(fast.gather(g, upd.indices, bs), REF.gather(g, upd.indices, bs))
    a, b = g.copy(), g.copy()
    REF.zero_blocks(a, upd.indices, bs)
    fast.zero_blocks(b, upd.indices, bs)
    np.testing.assert_array_equal(a, b)
    a, b = g.copy(), g.copy()
    REF.scatter_add(a, upd.indices, upd.values, bs, -0.5)
    fast.scatter_add(b, upd.indices, upd.values, bs, -0.5)
    np.testing.assert_array_equal(a, b)
    expect = g.copy()
    upd.add_into(expect, -0.5)  # and both agree with the payload type's own scatter
    np.testing.assert_allclose(a, expect, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("path", [*FAST_PATHS, "numpy"])
@pytest.mark.parametrize(
    "idx", [[0, 7], [3, 2], [1, 1], [-1, 2]], ids=["out-of-range", "decreasing", "duplicate", "negative"]
)
def test_scatter_rejects_bad_indices_before_writing(path: str, idx: list[int]) -> None:
    dense = np.zeros(100, np.float32)  # 7 blocks of 16
    vals = np.ones(len(idx) * 16, np.float32)
    with pytest.raises(KernelError):
        kernels_by_name(path).scatter_add(dense, np.array(idx, np.int64), vals, 16, 1.0)
    assert not dense.any()
    assert n_blocks(100, 16) == 7
