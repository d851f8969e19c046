"""The typed job settings (wanrt.protocol.job_settings): one validator for every record, per-site maps
that override the job-wide value at their site only, the merges the scheduler node makes (a decision
carried on, an operator's held values over the policy's), and errors that name the wire key."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from wanrt.errors import ConfigError
from wanrt.protocol.job_settings import (
    MAX_BATCH_SIZE,
    JobSettings,
    PlanSettings,
    TrainerSettings,
    check_setting,
    per_site,
)


def test_records_are_frozen_values() -> None:
    s = JobSettings(density=0.1, site_batch_size={"b": 2, "a": 1})
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.density = 0.2  # type: ignore[misc]
    with pytest.raises(TypeError):
        s.site_batch_size["a"] = 3  # type: ignore[index]
    assert list(s.site_batch_size) == ["a", "b"]  # sorted by site: equal settings compare and encode alike
    assert s == JobSettings(density=0.1, site_batch_size={"a": 1, "b": 2})


@pytest.mark.parametrize(
    ("build", "key"),
    [
        (lambda: TrainerSettings(density=0.0), "density"),
        (lambda: TrainerSettings(batch_size=MAX_BATCH_SIZE + 1), "batch_size"),
        (lambda: TrainerSettings(restart=-1), "restart"),
        (lambda: JobSettings(staleness=9), "staleness"),
        (lambda: JobSettings(site_batch_size={"a": 0}), "batch_size@a"),
        (lambda: JobSettings(site_local_steps={"b": 1.5}), "local_steps@b"),
        (lambda: JobSettings(site_batch_size={"a@b": 1}), "site_batch_size"),
        (lambda: PlanSettings(topology="mesh"), "topology"),  # type: ignore[arg-type]
        (lambda: PlanSettings(t_w_s=-1.0), "t_w_s"),
        (lambda: PlanSettings(site_costs={"a": -1.0}), "site_costs"),
        (lambda: PlanSettings(stragglers=("",)), "stragglers"),
    ],
)
def test_every_record_is_checked_by_the_one_validator(build: Any, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        build()
    assert err.value.key == key


def test_the_validator_names_the_wire_key_it_is_given() -> None:
    with pytest.raises(ConfigError) as err:
        check_setting("batch_size", 0, "batch_size@a")
    assert err.value.key == "batch_size@a"
    with pytest.raises(ConfigError) as err:
        check_setting("lr", 0.1)
    assert err.value.key == "lr"


def test_a_site_takes_its_own_values_over_the_job_wide_ones() -> None:
    s = JobSettings(
        density=0.1,
        batch_size=32,
        lr_scale=2.0,
        site_batch_size={"a": 16},
        site_batch_weight={"a": 0.5, "b": 1.5},
        site_restart={"b": 0},
        plan=PlanSettings(topology="ring"),
    )
    assert s.for_site("a") == TrainerSettings(density=0.1, batch_size=16, batch_weight=0.5, lr_scale=2.0)
    assert s.for_site("b") == TrainerSettings(
        density=0.1, batch_size=32, batch_weight=1.5, lr_scale=2.0, restart=0
    )
    assert s.for_site("c") == TrainerSettings(density=0.1, batch_size=32, lr_scale=2.0)
    assert s.sites() == {"a", "b"}
    assert not JobSettings().for_site("a") and not JobSettings()


def test_a_decision_carries_the_running_ones_values_on() -> None:
    running = JobSettings(density=0.1, site_batch_size={"a": 8, "b": 8}, plan=PlanSettings(topology="tree"))
    new = JobSettings(staleness=0, site_batch_size={"b": 4}, plan=PlanSettings(stragglers=()))
    assert running.overlay(new) == JobSettings(
        density=0.1,
        staleness=0,
        site_batch_size={"a": 8, "b": 4},
        plan=PlanSettings(topology="tree", stragglers=()),
    )
    ordered = JobSettings(density=0.1, site_restart={"a": 1})
    assert ordered.without_restarts() == JobSettings(density=0.1)


def test_held_values_win_and_a_held_job_wide_value_drops_the_policys_per_site_ones() -> None:
    policy = JobSettings(
        density=0.01,
        batch_size=8,
        site_batch_size={"a": 4, "b": 16},
        site_batch_weight={"a": 0.5},
        plan=PlanSettings(topology="ring"),
    )
    held = JobSettings(density=0.2, batch_size=20)
    assert held.held_over(policy) == JobSettings(
        density=0.2, batch_size=20, site_batch_weight={"a": 0.5}, plan=PlanSettings(topology="ring")
    )
    one_site = JobSettings(site_batch_size={"a": 12}, plan=PlanSettings(topology="star"))
    assert one_site.held_over(policy) == JobSettings(
        density=0.01,
        batch_size=8,
        site_batch_size={"a": 12, "b": 16},
        site_batch_weight={"a": 0.5},
        plan=PlanSettings(topology="star"),
    )


def test_released_keys_go_by_their_wire_names() -> None:
    held = JobSettings(density=0.2, site_batch_size={"a": 12, "b": 6})
    assert held.without(["batch_size@a"]) == JobSettings(density=0.2, site_batch_size={"b": 6})
    assert held.without(held.to_wire()) == JobSettings()


@pytest.mark.parametrize(
    ("values", "key", "words"),
    [
        ({}, "values", "no settings"),
        ({"lr": 0.1}, "lr", "settings that can change"),
        ({"density@a": 0.1}, "density@a", "no per-site form"),
        ({"lr_scale@a": 2.0}, "lr_scale@a", "whole job"),
        ({"restart": 0}, "restart", "names its site"),
        ({"batch_size@": 8}, "batch_size@", "one site"),
        ({"stragglers": "a,,b"}, "stragglers", "site names"),
    ],
)
def test_the_decoder_names_the_bad_key(values: dict[str, Any], key: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words) as err:
        JobSettings.from_wire(values)
    assert err.value.key == key


def test_a_trainer_setting_map_refuses_plan_and_per_site_keys() -> None:
    for values, key in (({"topology": "ring"}, "topology"), ({"batch_size@a": 8}, "batch_size@a")):
        with pytest.raises(ConfigError, match="not a trainer setting") as err:
            TrainerSettings.from_wire(values)
        assert err.value.key == key
    assert TrainerSettings.from_wire({"restart": 1}).without_restart() == TrainerSettings()


def test_plan_values_are_canonical() -> None:
    plan = PlanSettings(stragglers=("c", "b", "c"), site_costs={"b": 1230.0, "a": 0.123456})
    assert plan.stragglers == ("b", "c")
    wire = JobSettings(plan=plan).to_wire()
    # 3 significant digits where they read back exactly (the tree policy's rounding), more where needed
    assert wire == {"stragglers": "b,c", "site_costs": "a:0.123456,b:1.23e+03"}
    assert JobSettings.from_wire(wire).plan == plan


def test_a_results_file_reads_each_sites_values() -> None:
    timeline = {"batch": 32, "density": 0.1, **JobSettings(site_batch_size={"a": 16, "b": 48}).to_wire()}
    assert per_site(timeline, "batch_size") == {"a": 16, "b": 48}
    assert per_site(timeline, "local_steps") == {}
    with pytest.raises(ConfigError):
        per_site(timeline, "density")
