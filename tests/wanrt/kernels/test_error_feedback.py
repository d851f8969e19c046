"""Error feedback loses no gradient mass: sum(sent) + residual == sum(gradients), on every path."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.wanrt.kernels.conftest import CPU_PATHS, forced_path
from wanrt.errors import KernelError
from wanrt.kernels import COMPRESSOR_KINDS, ErrorFeedback, make_compressor


@pytest.mark.parametrize("path", CPU_PATHS)
@settings(deadline=None, max_examples=30)
@given(
    kind=st.sampled_from(COMPRESSOR_KINDS),
    n=st.integers(1, 2000),
    density=st.floats(0.001, 1.0),
    bs=st.sampled_from([None, 16, 7]),
    steps=st.integers(1, 25),
    seed=st.integers(0, 2**31),
)
def test_no_gradient_mass_is_lost(
    path: str, kind: str, n: int, density: float, bs: int | None, steps: int, seed: int
) -> None:
    if kind == "threshold_v":
        bs = None
    rng = np.random.default_rng(seed)
    with forced_path(path):
        c = make_compressor(kind, density=density, block_size=bs)
        ef = ErrorFeedback()
        total_grad = np.zeros(n, np.float64)
        total_sent = np.zeros(n, np.float64)
        magnitude = 0.0  # bounds |residual| at every step, hence the fp32 rounding of each addition
        for _ in range(steps):
            g = (rng.standard_normal(n) * rng.choice([1e-3, 1.0, 1e3])).astype(np.float32)
            total_grad += g
            magnitude += float(np.abs(g).max())
            p = ef.compress(3, g, c)
            p.validate()
            total_sent += p.to_dense()
        residual = ef.residual(3)
        assert residual is not None
        # one fp32 rounding (2**-24 relative) per step of a residual bounded by `magnitude`
        atol = magnitude * steps * 2.0**-23 + 1e-30
        np.testing.assert_allclose(total_sent + residual, total_grad, rtol=0, atol=atol)


def test_residual_is_exactly_what_was_not_sent() -> None:
    rng = np.random.default_rng(0)
    c = make_compressor("threshold_v_block", density=0.05)
    ef = ErrorFeedback()
    g1 = rng.standard_normal(1000).astype(np.float32)
    p1 = ef.compress(0, g1, c)
    r1 = ef.residual(0)
    assert r1 is not None
    sent = p1.to_dense()
    np.testing.assert_array_equal(sent + r1, g1)  # exact: sent positions copied, the rest untouched
    assert not np.any(r1[sent != 0])
    g2 = rng.standard_normal(1000).astype(np.float32)
    before = r1.copy()
    p2 = ef.compress(0, g2, c)
    np.testing.assert_array_equal(p2.to_dense() + ef.residual(0), before + g2)  # type: ignore[operator]


def test_gradient_is_not_modified() -> None:
    g = np.random.default_rng(1).standard_normal(500).astype(np.float32)
    keep = g.copy()
    ErrorFeedback().compress(0, g, make_compressor("threshold_v_block", density=0.1))
    np.testing.assert_array_equal(g, keep)


def test_layer_length_change_is_an_error_until_reset() -> None:
    c = make_compressor("topk", density=0.1)
    ef = ErrorFeedback()
    ef.compress(0, np.ones(100, np.float32), c)
    with pytest.raises(KernelError, match="reset"):
        ef.compress(0, np.ones(50, np.float32), c)
    ef.reset(0)
    ef.compress(0, np.ones(50, np.float32), c)


def test_state_dict_round_trip() -> None:
    rng = np.random.default_rng(2)
    c = make_compressor("threshold_v_block", density=0.05)
    ef = ErrorFeedback()
    for layer in (0, 1):
        ef.compress(layer, rng.standard_normal(300).astype(np.float32), c)
    state = ef.state_dict()
    other = ErrorFeedback()
    other.load_state_dict(state)
    for layer in (0, 1):
        np.testing.assert_array_equal(other.residual(layer), ef.residual(layer))  # type: ignore[arg-type]
    state["residuals"][0][:] = 0  # a copy, not a view of the live residual
    assert np.any(ef.residual(0))
    with pytest.raises(KernelError):
        other.load_state_dict({"residuals": {0: np.zeros((2, 2), np.float32)}})
