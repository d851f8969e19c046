"""The BSP simulation the benchmark uses: paired arms, and the policy's effect in small runs."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.stragglers import DetectionConfig, PolicyConfig
from sims.policies.bsp_sim import BspSimConfig, run, speedup
from wanrt.errors import ConfigError

FAST = PolicyConfig(detection=DetectionConfig(short_s=60.0, long_s=600.0), kill_restart=False)


def test_without_stragglers_or_heterogeneity_the_policy_changes_nothing() -> None:
    cfg = BspSimConfig(iterations=400, noise=0.0, policy=FAST)
    gain, base, ours = speedup(cfg)
    assert gain == 0.0
    assert ours.adjustments == 0
    np.testing.assert_array_equal(base.iteration_s, ours.iteration_s)


def test_adjust_bs_evens_out_heterogeneous_ranks() -> None:
    cfg = BspSimConfig(iterations=600, heterogeneity=0.5, overhead_s=0.05, policy=FAST, decision_every_s=30)
    ours = run(cfg, with_policy=True)
    base = run(cfg, with_policy=False)
    tail = ours.bpt_s[-100:].mean(axis=0)
    assert tail.max() / tail.min() < 1.05
    assert base.bpt_s.mean(axis=0).max() / base.bpt_s.mean(axis=0).min() > 2.0
    assert (ours.batches[-1].sum(), ours.batches[0].sum()) == (cfg.global_batch, cfg.global_batch)
    assert ours.jct_s < base.jct_s


def test_policy_beats_bsp_under_antdt_injection() -> None:
    pc = PolicyConfig(detection=DetectionConfig(short_s=60.0, long_s=600.0))
    cfg = BspSimConfig(iterations=2500, intensity=0.8, persistent_ranks=(0,), policy=pc, decision_every_s=30)
    gain, _, ours = speedup(cfg)
    assert gain > 0.3
    assert ours.restarts >= 1


def test_config_validation() -> None:
    with pytest.raises(ConfigError):
        BspSimConfig(intensity=2.0)
