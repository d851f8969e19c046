"""ADJUST_LR with local steps (STAR §IV-C: r_new = (M_new / M) · r): the job's ``lr_scale`` the straggler
policy announces with the k's, from the samples per WAN iteration S = Σ k·b·ranks over S_base (k = 1)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from gateways.wire.config_update import trainer_config_update
from scheduler.barrier.local_steps_policy import LocalStepsConfig, lr_scale_for
from scheduler.stragglers.daemon_policy import SiteStragglerPolicy
from scheduler.stragglers.site_config import SiteStragglerConfig
from tests.scheduler.barrier.test_local_steps_policy import _report
from wanrt.config import from_mapping
from wanrt.errors import ConfigError, LocalProtocolError
from wanrt.live_settings import MAX_LR_SCALE
from wanrt.protocol.scheduler.messages import site_values

#: micro-step s, per-rank batch, ranks: ZipLine gives a and b 3 steps, c 1 (test_local_steps_policy)
SETUP = {"a": (0.1, 32, 1), "b": (0.1, 32, 2), "c": (0.3, 32, 1)}
#: S = 3·32 + 3·32·2 + 32 = 320 samples per WAN iteration against S_base = 32 + 64 + 32 = 128
RATIO = 320 / 128


def test_the_rules_scale_by_the_samples_ratio_up_to_the_cap() -> None:
    assert lr_scale_for(320, 128, "linear", 8.0) == pytest.approx(2.5)
    assert lr_scale_for(320, 128, "sqrt", 8.0) == pytest.approx(math.sqrt(2.5))
    assert lr_scale_for(320, 128, "none", 8.0) is None
    assert lr_scale_for(320, 128, "linear", 2.0) == 2.0
    assert lr_scale_for(128 * 100, 128, "sqrt", 8.0) == 8.0
    assert lr_scale_for(128, 128, "linear", 8.0) == 1.0 and lr_scale_for(128, 128, "sqrt", 8.0) == 1.0
    with pytest.raises(LocalProtocolError):
        lr_scale_for(0, 128, "linear", 8.0)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("lr_scaling", "cubic"),
        ("max_lr_scale", 0.5),
        ("max_lr_scale", MAX_LR_SCALE + 1),
        ("max_lr_scale", True),
    ],
)
def test_bad_scaling_settings_are_refused(key: str, value: object) -> None:
    with pytest.raises(ConfigError) as info:
        LocalStepsConfig(**{key: value})  # type: ignore[arg-type]
    assert info.value.key == key


def test_the_toml_table_carries_the_rule_and_the_cap() -> None:
    table = {"local_steps": {"enabled": True, "lr_scaling": "sqrt", "max_lr_scale": 4}}
    cfg = from_mapping(SiteStragglerConfig, table, section="scheduler.stragglers")
    assert (cfg.local_steps.lr_scaling, cfg.local_steps.max_lr_scale) == ("sqrt", 4.0)
    with pytest.raises(ConfigError, match="lr_scaling"):
        from_mapping(SiteStragglerConfig, {"local_steps": {"lr_scaling": "x"}}, section="s")


def _policy(**local: Any) -> SiteStragglerPolicy:
    return SiteStragglerPolicy(
        ["a", "b", "c"], SiteStragglerConfig(local_steps=LocalStepsConfig(enabled=True, **local))
    )


def _first_decision(pol: SiteStragglerPolicy) -> dict[str, Any]:
    for it in range(8):
        for s, (micro, batch, world) in SETUP.items():
            _report(pol, s, it, micro, 1, batch, world)
    values = pol.decide(8.0)
    assert values is not None and values["local_steps@a"] == 3 and values["local_steps@c"] == 1
    return values


@pytest.mark.parametrize(
    ("rule", "cap", "want"),
    [("linear", 8.0, RATIO), ("sqrt", 8.0, math.sqrt(RATIO)), ("linear", 2.0, 2.0), ("none", 8.0, None)],
)
def test_the_steps_come_with_the_jobs_scale(rule: str, cap: float, want: float | None) -> None:
    values = _first_decision(_policy(lr_scaling=rule, max_lr_scale=cap))
    if want is None:
        assert "lr_scale" not in values  # a scale in force (a manual one) stays
    else:
        assert values["lr_scale"] == pytest.approx(want)
    for s in SETUP:  # every site's trainers take the same scale, and it passes the shared schema
        mine = site_values(values, s)
        assert mine.get("lr_scale") == values.get("lr_scale")
        trainer_config_update(mine, 9)


def test_the_scale_goes_back_to_one_with_the_steps() -> None:
    pol = _policy(lr_scaling="linear")
    values = _first_decision(pol)
    pol.committed(values, 9)
    # c recovers: as its window of times refills, ZipLine lowers the k's to 1 everywhere; each announcement
    # carries the scale of its own k's, the last one 1 again
    seen = []
    for it in range(9, 60):
        for s, (_, batch, world) in SETUP.items():
            _report(pol, s, it, 0.1, pol.local.running[s], batch, world)
        values = pol.decide(float(it) + 0.5)
        if values:
            pol.committed(values, it + 1)
            seen.append(values)
    assert seen
    for v in seen:
        samples = sum(v[f"local_steps@{s}"] * b * w for s, (_, b, w) in SETUP.items())
        assert v["lr_scale"] == pytest.approx(samples / 128)
    assert pol.local.running == dict.fromkeys(SETUP, 1)
    assert seen[-1]["lr_scale"] == 1.0


def test_a_split_without_new_steps_leaves_the_scale_alone() -> None:
    pol = _policy()
    pol.committed(_first_decision(pol), 9)
    weights = pol._values({"a": 32, "b": 16, "c": 64})  # a re-weighting with the k's in force
    assert "lr_scale" not in weights


def test_by_default_the_steps_leave_the_learning_rate_alone() -> None:
    # the measured default (docs/local_steps.md): a job that turns local steps on keeps its learning rate
    values = _first_decision(_policy())
    assert "lr_scale" not in values
