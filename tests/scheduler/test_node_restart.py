"""KILL_RESTART orders in the scheduler node: only its policy may make one, it is never carried into the
next decision, and /status lists it."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.node import SchedulerNode
from tests.scheduler.test_node import Policy, _announces, _cfg, _up
from wanrt.errors import ConfigError
from wanrt.protocol.scheduler.messages import AnnounceReply, site_values


def _commit_all(node: SchedulerNode, frontier: int = 10) -> None:
    prep = [m for _, m in _announces(node) if m.phase == "prepare"]
    assert prep
    for s in "abc":
        node.on_message(s, AnnounceReply(prep[0].decision, True, frontier), 1.1)
    node.pop_actions()


def test_post_config_cannot_order_a_restart() -> None:
    node = SchedulerNode(_cfg(), 0.0)
    _up(node, {"a": 10, "b": 10, "c": 10})
    for values in ({"restart@a": 0}, {"restart": 0}, {"density": 0.1, "restart@b": 1}):
        with pytest.raises(ConfigError) as info:
            node.request(values, 1.0)
        assert info.value.key is not None and info.value.key.startswith("restart")
    assert node.pending is None


def test_a_restart_order_is_one_shot() -> None:
    policy = Policy()
    node = SchedulerNode(_cfg(decide_interval_s=1.0), 0.0, policy=policy)
    _up(node, {"a": 10, "b": 10, "c": 10})
    policy.next = {"density": 0.05}
    node.tick(1.0)
    _commit_all(node)
    policy.next = {"restart@b": 0}
    node.tick(2.0)
    prep = [m for _, m in _announces(node) if m.phase == "prepare"]
    assert prep[0].values == {"density": 0.05, "restart@b": 0}
    for s in "abc":
        node.on_message(s, AnnounceReply(prep[0].decision, True, 10), 2.1)
    node.pop_actions()
    assert node.status(2.2)["restarts"] == [
        {"site": "b", "rank": 0, "decision": prep[0].decision, "effective_iteration": 15}
    ]
    policy.next = {"density": 0.1}
    node.tick(3.0)
    again = [m for _, m in _announces(node) if m.phase == "prepare"]
    assert again[0].values == {"density": 0.1}  # the order does not ride along


def test_only_the_named_site_sees_the_order() -> None:
    values: dict[str, Any] = {"density": 0.1, "restart@b": 2, "restart": 5}
    assert site_values(values, "b") == {"density": 0.1, "restart": 2}
    assert site_values(values, "a") == {"density": 0.1}
