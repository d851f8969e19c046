"""The local-steps simulation (tools/bench_stragglers.py part 7) on cases with a known answer."""

from __future__ import annotations

import pytest

from sims.policies.elastic_sim import ElasticSimConfig, run_elastic_sim
from wanrt.errors import ConfigError

# micro-steps of 0.1, 0.1 and 0.3 s at batch 32
THIRD = ElasticSimConfig(rates=(320.0, 320.0, 320.0 / 3), noise=0.0, rounds=20, warmup=4)


def test_without_noise_zipline_steps_remove_all_waiting() -> None:
    res = run_elastic_sim(THIRD)
    assert res["elastic"].steps == (3, 3, 1)
    assert res["elastic"].wait_share == pytest.approx(0.0, abs=1e-9)
    # BSP: two sites idle 0.2 s of every 0.3 s round
    assert res["bsp"].wait_share == pytest.approx(0.4 / 0.9)
    assert res["bsp"].samples_per_s == pytest.approx(96 / (0.3 + THIRD.exchange_s))
    assert res["elastic"].samples_per_s == pytest.approx(7 * 32 / (0.3 + THIRD.exchange_s))


def test_a_memory_capped_adjust_bs_cannot_move_and_a_free_one_balances() -> None:
    res = run_elastic_sim(THIRD)
    assert res["adjust_bs_capped"] == res["bsp"]
    assert sum(res["adjust_bs"].batches) == 96
    assert res["adjust_bs"].wait_share < 0.1 * res["bsp"].wait_share


def test_the_arms_share_their_noise_and_a_seed_repeats() -> None:
    cfg = ElasticSimConfig(rounds=50, seed=3)
    assert run_elastic_sim(cfg) == run_elastic_sim(cfg)
    equal = run_elastic_sim(ElasticSimConfig(rates=(200.0, 200.0), rounds=50))
    assert equal["elastic"].steps == (1, 1)
    assert equal["elastic"] == equal["bsp"]  # k = 1: the same micro-steps, the same draws


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ConfigError):
        ElasticSimConfig(rates=(1.0, 0.0))
