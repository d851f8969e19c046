"""The gradient noise scale estimator (McCandlish et al. App. A.1) on gradients with a known noise scale."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.stragglers import NoiseConfig, NoiseScale
from scheduler.stragglers.noise_scale import noise_scale_terms
from wanrt.errors import ConfigError, LocalProtocolError


def synthetic_steps(
    est: NoiseScale,
    rng: np.random.Generator,
    *,
    b_noise: float,
    batches: list[int],
    steps: int,
    dim: int = 64,
) -> None:
    """Per-sample gradients G + ξ with |G|² = 1 and tr Σ = b_noise: a batch of b has covariance Σ/b."""
    g = rng.standard_normal(dim)
    g /= np.linalg.norm(g)
    sigma2 = b_noise / dim
    for _ in range(steps):
        grads = [g + rng.standard_normal(dim) * np.sqrt(sigma2 / b) for b in batches]
        est.observe_gradients(grads, batches)


@pytest.mark.parametrize("batches", [[32, 32, 32, 32], [16, 64, 128]])
def test_recovers_a_known_noise_scale(batches: list[int]) -> None:
    est = NoiseScale(NoiseConfig(ema=0.999))
    synthetic_steps(est, np.random.default_rng(0), b_noise=500.0, batches=batches, steps=4000)
    assert est.phi == pytest.approx(500.0, rel=0.15)
    assert est.grad_sq == pytest.approx(1.0, rel=0.15)


def test_terms_are_exact_on_expected_norms() -> None:
    """With E|G_b|² = |G|² + S/b plugged in, the two-batch formulas return S and |G|² exactly."""
    s_true, g2_true = 300.0, 2.0
    small = [g2_true + s_true / b for b in (10, 30)]
    big_b = 40
    s, g2 = noise_scale_terms(small, [10, 30], g2_true + s_true / big_b, big_b)
    # mean of 1/b over the sites, as the estimator uses
    assert s == pytest.approx(s_true)
    assert g2 == pytest.approx(g2_true)


def test_preconditioning_scales_the_gradients_first() -> None:
    est_p, est = NoiseScale(NoiseConfig(ema=0.0)), NoiseScale(NoiseConfig(ema=0.0))
    grads = [np.array([1.0, 2.0]), np.array([3.0, -1.0])]
    est_p.observe_gradients(grads, [4, 4], precondition=np.array([2.0, 0.5]))
    est.observe_gradients([np.array([2.0, 1.0]), np.array([6.0, -0.5])], [4, 4])
    assert est_p.phi == pytest.approx(est.phi)


def test_initial_value_before_any_step() -> None:
    assert NoiseScale(NoiseConfig(initial=123.0)).phi == 123.0


def test_bad_inputs() -> None:
    est = NoiseScale()
    with pytest.raises(ConfigError):
        est.observe_gradients([np.ones(3)], [4])  # one site: no second batch size
    with pytest.raises(ConfigError):
        est.observe_norms([1.0, 1.0], [8, 8], 1.0, 8)  # big batch not bigger
    with pytest.raises(LocalProtocolError):
        est.observe_norms([float("nan"), 1.0], [8, 8], 1.0, 16)
