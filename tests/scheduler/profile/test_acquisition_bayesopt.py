"""Expected improvement, the paper's EI variant, and Algorithm 1's loop on synthetic probes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scheduler.profile.acquisition import batch_candidates, choose_batch, expected_improvement
from scheduler.profile.bayesopt import run_profile
from scheduler.profile.config import ProfileConfig
from wanrt.config import from_mapping
from wanrt.errors import ConfigError


def test_expected_improvement_properties() -> None:
    mean = np.array([0.0, 0.0, 1.0, -1.0])
    std = np.array([0.0, 1.0, 1.0, 0.0])
    ei = expected_improvement(mean, std, best=0.0)
    assert ei[0] == 0.0  # certain and no better
    assert ei[1] == pytest.approx(1 / math.sqrt(2 * math.pi))  # σ·φ(0)
    assert ei[1] > ei[2] > 0.0  # same uncertainty, worse mean: less improvement expected
    assert ei[3] == pytest.approx(1.0)  # certain improvement by 1
    assert np.all(expected_improvement(mean, std, best=0.0, xi=0.5) <= ei)


def test_choose_batch_picks_the_expected_best_and_prefers_uncertainty_on_ties() -> None:
    cands = batch_candidates(8, 512, 32)
    assert cands[0] == 8 and cands[-1] == 512 and np.all(np.diff(cands) > 0)

    def bowl(r: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return (np.log2(x) - 6.0) ** 2 * (1 + r), np.full_like(x, 0.1)

    x, ei = choose_batch(bowl, 0.5, cands)
    nearest = int(cands[np.argmin(np.abs(np.log2(cands) - 6.0))])
    assert x == nearest and int(cands[ei.argmax()]) == nearest

    def flat_but_unsure_at_200(r: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros_like(x), np.where(np.abs(x - 200) < 20, 1.0, 0.01)

    x, _ = choose_batch(flat_but_unsure_at_200, 0.5, cands)
    assert abs(x - 200) < 20


def _synthetic(r: float, x: int, s: int) -> float:
    """Loss with a per-r optimal batch: the best x falls as compression rises (x* = 128·(1 − r)^0.3)."""
    u = -math.log10(1 - r) if r < 1 else 3.0
    best = math.log2(128) - 0.3 * u * math.log2(10)
    return 0.5 * math.exp(0.08 * (math.log2(x) - best) ** 2 + 0.1 * u + 0.02 * s)


def test_algorithm_1_runs_n_probes_and_the_profile_finds_each_rs_best_batch() -> None:
    cfg = ProfileConfig(probes=30, init_probes=5, gp_restarts=0, seed=1)
    calls: list[tuple[float, int, int]] = []

    def probe(r: float, x: int, s: int) -> float:
        calls.append((r, x, s))
        return _synthetic(r, x, s)

    run = run_profile(probe, cfg, describe={"model": "synthetic"})
    assert run.probes == 30 and len(calls) == 32  # N probes + the baseline + the staleness run
    assert calls[0] == (0.0, cfg.middle_batch, 0) and calls[1] == (0.0, cfg.middle_batch, 1)
    assert all(s == 1 for _, _, s in calls[2:])
    assert run.profile.staleness_penalty == pytest.approx(math.exp(0.02) - 1)
    kinds = [rec.kind for rec in run.records]
    assert kinds.count("random") == 5 and kinds.count("ei") == 25
    assert len({rec.r for rec in run.records[2:]}) == 30  # a fresh random r every step
    cands = batch_candidates(cfg.min_total_batch, cfg.max_total_batch, 256)
    for r in (0.0, 0.9, 0.99):
        g_true = np.array([_synthetic(r, int(x), 1) for x in cands])
        pred = run.profile.penalty(np.full(cands.shape, r), cands)
        chosen = int(np.argmin(pred))
        assert g_true[chosen] <= g_true.min() * 1.10  # within 10 % of that r's best loss


def test_a_diverged_baseline_is_reported() -> None:
    with pytest.raises(ConfigError, match="baseline"):
        run_profile(lambda r, x, s: float("nan"), ProfileConfig(probes=2, init_probes=1))


def test_profile_config_validation_and_nested_probe_table() -> None:
    cfg = from_mapping(ProfileConfig, {"probes": 12, "probe": {"hidden": 32, "lr": 0.05}}, section="profile")
    assert cfg.probes == 12 and cfg.probe.hidden == 32 and cfg.middle_batch == (8 + 512) // 2
    for table, key in (
        ({"probes": 0}, "profile.probes"),
        ({"init_probes": 40}, "profile.init_probes"),
        ({"r_max": 1.0}, "profile.r_max"),
        ({"r_sampling": "sobol"}, "profile.r_sampling"),
        ({"probe": {"compressor": "zip"}}, "profile.probe.compressor"),
    ):
        with pytest.raises(ConfigError) as info:
            from_mapping(ProfileConfig, table, section="profile")
        assert info.value.fields["key"] == key
