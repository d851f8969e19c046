"""Low-bit values on the leader: quantised after selection, the quantisation error kept in the residual, so
error feedback still loses nothing (issue 23)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from wanrt.client.config import ClientConfig
from wanrt.client.leader.compression import LayerCompressor
from wanrt.client.leader.device_path import DeviceLayerCompressor
from wanrt.codec import decode_payload, encode_payload
from wanrt.codec.lowbit import VALUE_CODINGS, usable_coded
from wanrt.errors import ConfigError


def _sent_after_the_wire(p: object) -> np.ndarray:
    meta, buffers = encode_payload(p)  # type: ignore[arg-type]
    d = decode_payload(meta, [bytes(b) for b in buffers])
    assert meta["dtype"] in VALUE_CODINGS
    return d.to_dense()


@pytest.mark.parametrize("coding", VALUE_CODINGS)
def test_one_step_sent_plus_residual_is_the_gradient(coding: str) -> None:
    """The residual at the selected positions is ``selected - dequantised``: one fp32 subtraction, so
    ``sent + residual`` equals the gradient to within one rounding of that difference."""
    g = np.random.default_rng(1).standard_normal(4000).astype(np.float32)
    lc = LayerCompressor(ClientConfig(density=0.05, wire_dtype=coding))  # type: ignore[arg-type]
    p = lc.compress(0, g)
    assert usable_coded(p) is not None
    sent = _sent_after_the_wire(p)
    np.testing.assert_array_equal(sent, p.to_dense())  # what the wire carries is what was accounted for
    r = lc._ef.residual(0)  # type: ignore[union-attr]
    total = sent.astype(np.float64) + r
    np.testing.assert_array_equal(total[sent == 0], g[sent == 0])  # untouched positions: exact
    np.testing.assert_allclose(total, g, rtol=0, atol=float(np.abs(g).max()) * 2.0**-23)
    assert np.any(r[sent != 0])  # the quantisation error is really there (int8 included)


@settings(deadline=None, max_examples=25)
@given(
    coding=st.sampled_from(VALUE_CODINGS),
    density=st.sampled_from([0.01, 0.1, 1.0]),
    n=st.integers(1, 1500),
    steps=st.integers(1, 12),
    seed=st.integers(0, 2**31),
)
def test_no_gradient_mass_is_lost_over_steps(
    coding: str, density: float, n: int, steps: int, seed: int
) -> None:
    """The error-feedback invariant of tests/wanrt/kernels/test_error_feedback.py, through the codec, for
    sparse payloads (the compressor's residual) and dense ones (the coder's own residual)."""
    rng = np.random.default_rng(seed)
    lc = LayerCompressor(ClientConfig(density=density, wire_dtype=coding))  # type: ignore[arg-type]
    total_grad = np.zeros(n, np.float64)
    total_sent = np.zeros(n, np.float64)
    magnitude = 0.0
    for _ in range(steps):
        g = (rng.standard_normal(n) * rng.choice([1e-3, 1.0, 1e3])).astype(np.float32)
        total_grad += g
        magnitude += float(np.abs(g).max())
        p = lc.compress(3, g)
        p.validate()
        total_sent += _sent_after_the_wire(p)
    sparse = density < 1.0
    residual = lc._ef.residual(3) if sparse else lc._coder._dense[3][:n]  # type: ignore[union-attr]
    assert residual is not None
    # two fp32 roundings (the residual's update and the error's subtraction) per step
    atol = magnitude * steps * 2.0**-22 + 1e-30
    np.testing.assert_allclose(total_sent + residual, total_grad, rtol=0, atol=atol)


def test_error_feedback_makes_the_average_converge_for_2_bit() -> None:
    """A constant gradient sent at 2 bits: without the error in the residual the bias would stay; with it
    the mean of what was sent converges to the gradient."""
    g = np.random.default_rng(2).standard_normal(1600).astype(np.float32)
    lc = LayerCompressor(ClientConfig(density=1.0, wire_dtype="int2"))
    sent = np.zeros(1600, np.float64)
    steps = 200
    for _ in range(steps):
        sent += lc.compress(0, g).to_dense()
    one = np.abs(lc.compress(0, g).to_dense() - g).mean()
    assert np.abs(sent / steps - g).mean() < one / 20


def test_residual_resets_and_checkpoints() -> None:
    cfg = ClientConfig(density=1.0, wire_dtype="int4")
    lc = LayerCompressor(cfg)
    g = np.random.default_rng(3).standard_normal(100).astype(np.float32)
    lc.compress(0, g)
    state = lc.state_dict()
    other = LayerCompressor(cfg)
    other.load_state_dict(state)
    np.testing.assert_array_equal(other.compress(0, g).values, lc.compress(0, g).values)
    lc.reset_residuals()
    np.testing.assert_array_equal(lc.compress(0, g).values, LayerCompressor(cfg).compress(0, g).values)


@pytest.mark.parametrize("density", [0.1, 1.0])
def test_device_path_matches_the_host_path(density: float) -> None:
    cfg = ClientConfig(density=density, wire_dtype="int4")
    host, dev = LayerCompressor(cfg), DeviceLayerCompressor(cfg)
    rng = np.random.default_rng(4)
    for _ in range(3):
        g = rng.standard_normal(1000).astype(np.float32)
        a = host.compress(1, g)
        b = dev.compress_tensor(1, torch.from_numpy(g.copy()), None, 1.0)
        np.testing.assert_array_equal(a.indices, b.indices)
        np.testing.assert_array_equal(a.values, b.values)
        assert usable_coded(b) is not None


def test_config_keys_are_checked() -> None:
    with pytest.raises(ConfigError, match="wire_dtype"):
        ClientConfig(wire_dtype="int3")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="scale_block"):
        ClientConfig(wire_dtype="int8", scale_block=0)
    lc = LayerCompressor(ClientConfig(density=0.1, wire_dtype="int8", scale_block=32))
    p = lc.compress(0, np.random.default_rng(5).standard_normal(3200).astype(np.float32))
    coded = usable_coded(p)
    assert coded is not None and coded.scale_block == 32
