"""The gateway relays its trainer's shard traffic under its own site's name and checks what comes back."""

from __future__ import annotations

import pytest

from gateways.config import GatewayConfig
from gateways.node import GatewayNode, ToScheduler, ToTrainer
from wanrt.errors import RemoteProtocolError
from wanrt.protocol import ShardDone, ShardGrant, ShardRequest
from wanrt.protocol.scheduler.messages import (
    SiteShardDone,
    SiteShardGrant,
    SiteShardRelease,
    SiteShardRequest,
)


def _node() -> GatewayNode:
    node = GatewayNode(GatewayConfig(site="a", job="j", secret="x" * 32), 0.0)
    node.start(0.0)
    node.trainer_connected(1)
    node.scheduler_connected(0.0)
    node.pop_actions()
    return node


def _sched(node: GatewayNode) -> list[object]:
    return [a.msg for a in node.pop_actions() if isinstance(a, ToScheduler)]


def test_requests_and_reports_go_to_the_scheduler_under_this_site_s_name() -> None:
    node = _node()
    node.trainer_shards(1, ShardRequest(3, 7, 0, 100, 2, True), 0.1)
    assert _sched(node) == [SiteShardRequest("a", 3, 7, 0, 100, 2, True)]
    node.trainer_shards(1, ShardDone(3, 0, (4, 5)), 0.2)
    assert _sched(node) == [SiteShardDone("a", 3, 0, (4, 5))]
    node.trainer_shards(2, ShardDone(3, 0, (6,)), 0.2)  # not the current trainer session: ignored
    assert node.pop_actions() == []


def test_grants_reach_the_trainer_and_another_site_s_grant_ends_the_link() -> None:
    node = _node()
    node.scheduler_message(SiteShardGrant("a", 3, 7, 0, "granted", ((4, 40, 50),)), 0.3)
    acts = node.pop_actions()
    assert acts == [ToTrainer(1, ShardGrant(3, 7, 0, "granted", ((4, 40, 50),)))]
    with pytest.raises(RemoteProtocolError):
        node.scheduler_message(SiteShardGrant("b", 3, 7, 0, "wait", ()), 0.3)


def test_a_trainer_leaving_releases_its_shards_even_those_granted_after_it_left() -> None:
    node = _node()
    node.trainer_disconnected(1, "killed")
    assert _sched(node) == [SiteShardRelease("a", "killed")]
    node.scheduler_message(SiteShardGrant("a", 0, 1, 0, "granted", ((4, 40, 50),)), 0.3)
    msgs = _sched(node)
    assert len(msgs) == 1 and isinstance(msgs[0], SiteShardRelease)


def test_without_the_scheduler_requests_are_unavailable_and_reports_wait_for_it() -> None:
    node = _node()
    node.scheduler_disconnected(1.0)
    node.trainer_shards(1, ShardRequest(0, 1, 0, 100, 1, False), 1.1)
    node.trainer_shards(1, ShardDone(0, 0, (9,)), 1.2)
    acts = node.pop_actions()
    assert acts == [ToTrainer(1, ShardGrant(0, 1, 0, "unavailable", ()))]
    node.trainer_disconnected(1, "killed")
    node.scheduler_connected(2.0)
    msgs = _sched(node)
    assert msgs[1:] == [SiteShardDone("a", 0, 0, (9,)), SiteShardRelease("a", "killed")]  # after telemetry
