"""The AIMD threshold controller: direction of its moves, bounds, and tracking of drifting gradients."""

from __future__ import annotations

import math

import numpy as np
import pytest

from wanrt.kernels import CompressorConfig, ErrorFeedback, ThresholdV, make_compressor
from wanrt.kernels.aimd import FLT_MIN, ThresholdState, initial_threshold, targets, update

CFG = CompressorConfig()
T = targets(16 * 100_000, 16, 0.01, CFG)


def test_targets() -> None:
    assert T.k_block == 1000
    assert T.cap == 1000
    assert T.aim == math.ceil(1.25 * 1000 + 2 * math.sqrt(1000))
    assert T.buffer == math.ceil(4 * T.aim)
    tiny = targets(10, 16, 0.5, CFG)
    assert (tiny.k_block, tiny.aim, tiny.cap, tiny.buffer, tiny.n_blocks) == (1, 1, 1, 1, 1)
    assert tiny.dense


def test_too_many_increases_v_by_the_measured_gap() -> None:
    st = ThresholdState(v=10.0)
    update(st, count=3 * T.aim, aim_v=12.0, count_above_probe=T.aim // 2, t=T, cfg=CFG)
    assert st.v == pytest.approx(12.0, rel=1e-6)  # no trend or error history yet


def test_too_few_decreases_multiplicatively_within_the_clip() -> None:
    st = ThresholdState(v=10.0, steepness=2.0)
    update(st, count=T.k_block // 10, aim_v=None, count_above_probe=T.k_block // 20, t=T, cfg=CFG)
    eps = 1e-6  # v is rounded to fp32
    assert 10.0 * CFG.md_floor * (1 - eps) <= st.v <= 10.0 * CFG.md_ceiling * (1 + eps)
    st2 = ThresholdState(v=10.0, steepness=60.0)  # very steep tail: a tiny step is enough
    update(st2, count=T.k_block - 1, aim_v=None, count_above_probe=0, t=T, cfg=CFG)
    assert 10.0 * CFG.md_floor * (1 - eps) <= st2.v <= 10.0 * CFG.md_ceiling * (1 + eps)


def test_fewer_nonzero_blocks_than_the_aim_floors_v() -> None:
    st = ThresholdState(v=5.0, log_drift=0.3, last_log_aim=1.0)
    update(st, count=T.aim, aim_v=0.0, count_above_probe=0, t=T, cfg=CFG)
    assert st.v == FLT_MIN and st.log_drift == 0.0 and st.last_log_aim is None


def test_a_steady_drift_is_learned() -> None:
    st = ThresholdState(v=1.0)
    for i in range(30):
        aim_v = 1.05**i
        update(st, count=T.aim * 2, aim_v=aim_v, count_above_probe=T.aim // 3, t=T, cfg=CFG)
    assert st.log_drift == pytest.approx(math.log(1.05), rel=1e-3)
    assert st.err_var < 1e-6  # and predicted well, so no margin is kept


def test_initial_threshold_from_a_sample() -> None:
    sample = np.sort(np.arange(1, 4097, dtype=np.float32))[::-1]
    v = initial_threshold(sample, n_blocks=4096 * 100, aim=4096 * 100 // 64, cfg=CFG)
    assert v == pytest.approx(4096 - 64 + 1)
    assert initial_threshold(sample, n_blocks=10**9, aim=100, cfg=CFG) is None  # too rare to sample


def test_state_round_trip() -> None:
    st = ThresholdState(v=3.0, log_drift=0.1, err_var=0.01, last_log_aim=1.0, pred_log_aim=1.1, steepness=9)
    assert ThresholdState.from_dict(st.as_dict()) == st


def _steps_to_target(counts: np.ndarray, tol: float = 0.1) -> int:
    bad = np.nonzero(np.abs(counts - 1.0) > tol)[0]
    return int(bad[-1] + 1) if bad.shape[0] else 0


@pytest.mark.parametrize("direction", [1, -1], ids=["growing", "shrinking"])
@pytest.mark.parametrize("feedback", [False, True], ids=["plain", "error-feedback"])
@pytest.mark.parametrize("tail", ["gauss", "lognormal"])
def test_tracks_a_10x_drift_over_50_steps(direction: int, feedback: bool, tail: str) -> None:
    n, steps = 16 * 10_000, 50
    rng = np.random.default_rng((direction + 1) + 4 * feedback)
    scale = np.exp(rng.standard_normal(n)).astype(np.float32) if tail == "lognormal" else np.float32(1)
    c = make_compressor("threshold_v_block", density=0.01)
    assert isinstance(c, ThresholdV)
    ef = ErrorFeedback()
    kb = c.targets(n).k_block
    counts = []
    for i in range(steps):
        g = (
            rng.standard_normal(n).astype(np.float32)
            * scale
            * np.float32(10 ** (direction * i / (steps - 1)))
        )
        p = ef.compress(0, g, c) if feedback else c.compress(0, g)
        counts.append(p.nnz_blocks / kb)
    assert max(counts) <= 1.0  # the cap holds every step
    assert _steps_to_target(np.array(counts)) <= 5
    assert c.exact_steps(0) <= 5  # the exact fallback pass stays rare
