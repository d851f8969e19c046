"""The scheduler's control plane takes the job's ``lr_scale`` as a manual request like the other trainer
keys (``POST /config`` reaches :meth:`SchedulerNode.request`), announces it to every site alike, and refuses a
per-site one and one out of bounds by name, before anything is announced."""

from __future__ import annotations

import pytest

from scheduler.node import SchedulerNode
from tests.scheduler.test_node import _announces, _cfg, _up
from wanrt.errors import ConfigError
from wanrt.protocol.scheduler.messages import check_site_keys, site_values


def test_a_manual_scale_is_announced_to_every_site_alike() -> None:
    node = SchedulerNode(_cfg(), 0.0)
    _up(node, {"a": 3, "b": 3, "c": 3})
    done = node.request({"lr_scale": 2.5, "local_steps@a": 4}, 1.0)
    assert done["state"] == "preparing"
    prep = _announces(node)
    assert {s for s, _ in prep} == {"a", "b", "c"}
    for _, msg in prep:
        assert msg.values == {"lr_scale": 2.5, "local_steps@a": 4}
    assert site_values(prep[0][1].values, "b") == {"lr_scale": 2.5}
    assert site_values(prep[0][1].values, "a") == {"lr_scale": 2.5, "local_steps": 4}


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"lr_scale": 0}, "lr_scale"),
        ({"lr_scale": 1000}, "lr_scale"),
        ({"lr_scale": -1.0}, "lr_scale"),
        ({"lr_scale@a": 2.0}, "lr_scale@a"),
        ({"lr_scale@zz": 2.0}, "lr_scale@zz"),
        ({"density@a": 0.1}, "density@a"),  # no per-site form either: was silently dropped
    ],
)
def test_bad_scales_are_refused_by_name_before_any_announcement(values: dict[str, float], key: str) -> None:
    node = SchedulerNode(_cfg(), 0.0)
    _up(node, {"a": 3, "b": 3, "c": 3})
    with pytest.raises(ConfigError) as info:
        node.request(values, 1.0)
    assert info.value.fields.get("key") == key
    assert _announces(node) == [] and node.pending is None


def test_per_site_keys_of_the_per_site_settings_pass() -> None:
    check_site_keys({"batch_size@a": 8, "batch_weight@a": 1.0, "local_steps@a": 2, "lr_scale": 2.0})
    with pytest.raises(ConfigError, match="whole job"):
        check_site_keys({"lr_scale@b": 2.0})
