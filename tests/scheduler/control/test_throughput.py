"""Eq. 2 throughput fit: recovers known (α, β), stays sane with few or noisy points."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.control.throughput import ThroughputModel, fit_throughput, throughput
from wanrt.errors import ConfigError, RemoteProtocolError


@pytest.mark.parametrize(("alpha", "beta"), [(28.0, 300.0), (20.0, 99.0), (64.0, 270.0), (16.0, 80.0)])
def test_fit_recovers_known_alpha_beta_from_noisy_points(alpha: float, beta: float) -> None:
    rng = np.random.default_rng(1)
    xs = np.repeat(np.array([alpha * f for f in (0.25, 0.5, 0.8, 1.3, 2.0, 3.0)]).round(), 6)
    ys = throughput(xs, alpha, beta) * (1 + 0.03 * rng.standard_normal(xs.size))
    fit = fit_throughput(xs, ys)
    assert fit.fitted
    assert fit.alpha == pytest.approx(alpha, rel=0.08)
    assert fit.beta == pytest.approx(beta, rel=0.03)


def test_outliers_do_not_move_the_fit() -> None:
    xs = np.repeat([8.0, 16.0, 32.0, 64.0], 9)
    ys = throughput(xs, 24.0, 200.0)
    ys[::9] *= 0.2  # one iteration in nine hit a GC pause
    fit = fit_throughput(xs, ys)
    assert fit.alpha == pytest.approx(24.0, rel=0.02)
    assert fit.beta == pytest.approx(200.0, rel=0.02)


def test_one_batch_size_is_read_as_the_knee() -> None:
    fit = fit_throughput([32, 32, 32], [250.0, 260.0, 255.0])
    assert not fit.fitted
    assert (fit.alpha, fit.beta) == (32.0, 255.0)
    # conservative: a larger batch is predicted no faster, a smaller one no quicker per iteration
    assert float(fit.throughput(64)) == 255.0
    assert float(fit.iteration_time(8)) == pytest.approx(32 / 255.0)


def test_points_all_below_the_knee_give_the_slope_and_a_knee_at_the_largest() -> None:
    xs = np.array([4.0, 8.0, 12.0])
    fit = fit_throughput(xs, throughput(xs, 40.0, 400.0))
    assert fit.beta / fit.alpha == pytest.approx(10.0, rel=0.02)
    # β itself is not identified; the prior keeps it where the data end rather than anywhere above
    assert 12.0 * 0.9 <= fit.alpha <= 40.0


def test_model_window_forgets_old_points() -> None:
    m = ThroughputModel(window=8, min_batches=2)
    for x in (10, 40) * 4:
        m.observe(x, float(throughput(x, 20.0, 100.0)))
    first = m.fit()
    assert first is not None
    assert (first.alpha, first.beta) == (pytest.approx(20.0, rel=0.02), pytest.approx(100.0, rel=0.02))
    for x in (10, 40) * 4:  # the GPU got twice as fast; only the newest 8 points count
        m.observe(x, float(throughput(x, 20.0, 200.0)))
    assert m.n_points == 8
    second = m.fit()
    assert second is not None
    assert (second.alpha, second.beta) == (pytest.approx(20.0, rel=0.02), pytest.approx(200.0, rel=0.02))


def test_model_without_points_has_no_fit_and_refuses_bad_telemetry() -> None:
    m = ThroughputModel()
    assert m.fit() is None
    for bad in ((0, 10.0), (8, 0.0), (8, float("nan")), (float("inf"), 1.0)):
        with pytest.raises(RemoteProtocolError):
            m.observe(*bad)
    with pytest.raises(ConfigError):
        fit_throughput([1, 2], [1.0])
