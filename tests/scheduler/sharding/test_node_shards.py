"""The scheduler node serves shards to gateways: only for their own site, grants go back to the asker,
and a silent holder's lease expires on the node's timer."""

from __future__ import annotations

import pytest

from scheduler.daemon_config import SchedulerDaemonConfig
from scheduler.node import SchedulerNode, SendTo
from scheduler.sharding import ShardingConfig
from wanrt.errors import RemoteProtocolError
from wanrt.protocol.scheduler.messages import (
    SiteShardDone,
    SiteShardGrant,
    SiteShardRelease,
    SiteShardRequest,
)


def _node() -> SchedulerNode:
    cfg = SchedulerDaemonConfig(
        job="j",
        sites=("a", "b"),
        secret="x" * 32,
        decide_interval_s=100.0,
        sharding=ShardingConfig(shard_size=10, lease_s=5.0),
    )
    node = SchedulerNode(cfg, 0.0)
    for s in ("a", "b"):
        node.gateway_up(s, 0.0)
    node.pop_actions()
    return node


def test_a_request_is_answered_to_the_asking_site_and_done_is_taken_from_the_holder() -> None:
    node = _node()
    node.on_message("a", SiteShardRequest("a", 0, 9, 0, 25, 2, False), 1.0)
    (act,) = node.pop_actions()
    assert isinstance(act, SendTo) and act.site == "a" and isinstance(act.msg, SiteShardGrant)
    grant = act.msg
    assert grant.request == 9 and grant.status == "granted" and len(grant.shards) == 2
    node.on_message("b", SiteShardDone("b", 0, 0, (grant.shards[0][0],)), 1.5)
    assert node.shards.stats.refused == 1
    node.on_message("a", SiteShardDone("a", 0, 0, tuple(s[0] for s in grant.shards)), 2.0)
    assert node.shards.counts()["done"] == 2 and node.status(2.0)["shards"]["done"] == 2


def test_a_gateway_may_not_speak_for_another_site() -> None:
    node = _node()
    with pytest.raises(RemoteProtocolError):
        node.on_message("a", SiteShardRequest("b", 0, 1, 0, 25, 1, False), 1.0)
    with pytest.raises(RemoteProtocolError):
        node.on_message("a", SiteShardRelease("b", "x"), 1.0)


def test_leases_expire_on_the_node_s_timer_and_a_release_requeues_at_once() -> None:
    node = _node()
    node.on_message("a", SiteShardRequest("a", 0, 1, 0, 25, 1, False), 1.0)
    node.on_message("b", SiteShardRequest("b", 0, 1, 0, 25, 1, False), 1.0)
    assert node.next_deadline() == 6.0
    node.on_message("b", SiteShardRelease("b", "killed"), 2.0)
    assert node.shards.stats.released == 1
    node.tick(6.0)
    assert node.shards.stats.expired == 1 and node.shards.counts()["doing"] == 0
