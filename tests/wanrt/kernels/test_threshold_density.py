"""Threshold-v sends the density it was given: the selected block count stays within ±25 % of k_block in
at least 95 % of steps, with error feedback, for constant, drifting and random gradients (StellaTrain
§3.2's "selects the top k/16 cache-aligned blocks"; the scheduler sizes the density to the WAN, §4).

Through the client's own layer compressor (what the site leader runs), on gradients whose block-sum tails
differ: a steady gradient (with error feedback the residual's tail becomes a cliff), one whose scale
drifts up or down every step, and fresh heavy- or light-tailed draws.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from wanrt.client.config import ClientConfig
from wanrt.client.leader.compression import LayerCompressor
from wanrt.kernels import CompressorConfig, aimd

STEPS = 20
BAND = 0.25
MIN_IN_BAND = 0.95


def _draw(rng: np.random.Generator, n: int, tail: str) -> np.ndarray:
    if tail == "normal":
        return rng.standard_normal(n).astype(np.float32)
    if tail == "student3":
        return rng.standard_t(3, n).astype(np.float32)
    # per-block scales spread over two decades: a few layers' worth of very different magnitudes
    scales = np.exp(rng.normal(0.0, 1.2, -(-n // 16))).repeat(16)[:n]
    return (rng.standard_normal(n) * scales).astype(np.float32)


@settings(max_examples=30, deadline=None)
@given(
    kind=st.sampled_from(["constant", "drift", "random"]),
    tail=st.sampled_from(["normal", "student3", "scaled"]),
    seed=st.integers(0, 2**31 - 1),
    blocks=st.integers(2_000, 16_000),
    density=st.sampled_from([0.005, 0.01, 0.02, 0.05]),
    drift=st.floats(0.6, 1.5),
)
def test_selected_count_holds_the_density(
    kind: str, tail: str, seed: int, blocks: int, density: float, drift: float
) -> None:
    n = blocks * 16
    rng = np.random.default_rng(seed)
    lc = LayerCompressor(ClientConfig(density=density, error_feedback=True))
    kb = aimd.targets(n, 16, density, CompressorConfig()).k_block
    g0 = _draw(rng, n, tail)
    counts = []
    for t in range(STEPS):
        if kind == "constant":
            g = g0
        elif kind == "drift":
            g = g0 * np.float32(drift**t)
        else:
            g = _draw(rng, n, tail)
        p = lc.compress(0, g)
        assert p.nnz_blocks <= kb  # never more than the cap (cap_factor 1)
        counts.append(p.nnz_blocks)
    in_band = sum(abs(c - kb) <= BAND * kb for c in counts)
    assert in_band >= math.ceil(MIN_IN_BAND * STEPS), (kb, counts)


def test_floor_follows_the_config() -> None:
    t = aimd.targets(16 * 10_000, 16, 0.01, CompressorConfig(fill_floor=0.5))
    assert t.floor == math.ceil(0.5 * t.k_block)
    assert aimd.targets(16 * 10_000, 16, 0.01, CompressorConfig(fill_floor=0.0)).floor == 1
    assert aimd.targets(160, 16, 0.01, CompressorConfig()).floor == 1  # k_block 1: only "none" is short
