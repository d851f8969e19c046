"""A scheduler decision's plan settings at one gateway node, driven directly: checked in prepare (refused,
not raised, when this gateway cannot apply them), applied at commit from the decision's iteration, never
taken from the gateway's own POST /config."""

from __future__ import annotations

from typing import Any

import pytest

from gateways.config import GatewayConfig
from gateways.node import GatewayNode
from gateways.node.actions import ToScheduler
from gateways.node.plan_values import plan_problem, plan_spec
from gateways.rounds.config import RoundConfig
from gateways.rounds.topology import TOPOLOGY_KINDS
from wanrt.errors import ConfigError
from wanrt.live_settings import PLAN_TOPOLOGIES, check_live_settings, parse_stragglers
from wanrt.protocol.scheduler.messages import Announce, AnnounceReply

SITES = ("a", "b", "c")


def _node() -> GatewayNode:
    """A one-site job: joined at once, so prepare answers depend only on the values and iterations."""
    cfg = GatewayConfig(site="a", job="j", secret="x" * 32, rounds=RoundConfig(topology="star"))
    node = GatewayNode(cfg, 0.0)
    node.start(0.0)
    node.scheduler_connected(0.0)
    node.pop_actions()
    return node


def _replies(node: GatewayNode) -> list[AnnounceReply]:
    out = [a.msg for a in node.pop_actions() if isinstance(a, ToScheduler)]
    return [m for m in out if isinstance(m, AnnounceReply)]


def _announce(node: GatewayNode, decision: int, phase: str, values: dict[str, Any], at: int = 10) -> None:
    node.scheduler_message(Announce(decision, phase, at, values), 1.0)


def test_the_public_schema_knows_the_gateways_topologies() -> None:
    assert PLAN_TOPOLOGIES == TOPOLOGY_KINDS


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"topology": "mesh"}, "topology"),
        ({"stragglers": 3}, "stragglers"),
        ({"stragglers": "a,,b"}, "stragglers"),
        ({"t_w_s": -0.1}, "t_w_s"),
        ({"t_w_s": float("nan")}, "t_w_s"),
        ({"t_w_s": True}, "t_w_s"),
    ],
)
def test_the_shared_schema_names_the_bad_plan_key(values: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_live_settings(values)
    assert err.value.key == key


def test_straggler_lists_are_canonical() -> None:
    assert parse_stragglers(" c, b ,c") == ("b", "c")
    assert parse_stragglers("") == ()


def test_every_gateway_builds_the_same_spec_from_the_same_values() -> None:
    rounds = RoundConfig(topology="tree")
    values = {"topology": "parent_child", "stragglers": "c", "t_w_s": 0.25, "density": 0.1}
    spec = plan_spec(values, rounds, None, SITES)
    assert spec is not None and spec == plan_spec(dict(reversed(values.items())), rounds, None, SITES[::-1])
    assert spec.kind == "parent_child" and spec.stragglers == ("c",) and spec.t_w_s == 0.25
    assert plan_spec({"density": 0.1}, rounds, None, SITES) is None  # nothing about the plan
    # a key left out keeps the gateway's configured value: only the stragglers change
    only = plan_spec({"stragglers": "b"}, rounds, None, SITES)
    assert only is not None and only.kind == "tree" and only.t_w_s is None
    assert plan_problem({"stragglers": "z"}, rounds, None, SITES) is not None


def test_a_plan_naming_an_unknown_site_is_refused_in_prepare_and_never_applied() -> None:
    node = _node()
    assert node.engine is not None
    before = node.engine.plan_for(20)
    _announce(node, 1, "prepare", {"topology": "parent_child", "stragglers": "c", "t_w_s": 0.1})
    [reply] = _replies(node)
    assert reply.decision == 1 and not reply.accepted
    _announce(node, 2, "prepare", {"topology": "warp", "density": 0.5})  # bad topology: refused, no raise
    [reply] = _replies(node)
    assert not reply.accepted
    assert node.engine.plan_for(20) == before and node.scheduler.decision == 0


def test_a_committed_plan_governs_rounds_from_its_iteration_on() -> None:
    node = _node()
    assert node.engine is not None
    values = {"topology": "ring", "t_w_s": 0.5}
    _announce(node, 1, "prepare", values)
    [reply] = _replies(node)
    assert reply.accepted
    _announce(node, 1, "commit", values)
    assert node.engine.plan_for(9).spec.kind == "star"
    plan = node.engine.plan_for(10)
    assert plan.spec.kind == "ring" and plan.spec.t_w_s == 0.5
    # no trainer settings in the decision: nothing forwarded to the trainers
    assert node.scheduler.config_update is None
    # the running plan is reported, so a restarted scheduler learns it back
    m = node.telemetry(2.0).metrics
    assert m["plan.parent_child"] == 0.0 and m["plan.t_w_s"] == 0.5


def test_plan_values_travel_with_trainer_values_but_only_trainer_values_reach_the_trainer() -> None:
    node = _node()
    values = {"topology": "ring", "stragglers": "", "density": 0.2}
    _announce(node, 1, "prepare", values)
    assert _replies(node)[0].accepted
    _announce(node, 1, "commit", values)
    update = node.scheduler.config_update
    assert update is not None and update.values == {"density": 0.2}


def test_the_gateways_own_config_endpoint_refuses_plan_settings() -> None:
    with pytest.raises(ConfigError) as err:
        _node().apply_config({"topology": "ring"}, None, 1.0)
    assert err.value.key == "topology"


def test_a_committed_x_order_is_reported_so_a_restarted_scheduler_learns_it() -> None:
    node = _node()
    assert node.engine is not None
    values = {"x_order": 2}
    _announce(node, 1, "prepare", values)
    [reply] = _replies(node)
    assert reply.accepted
    _announce(node, 1, "commit", values)
    assert node.engine.plan_for(10).spec.x_order == 2
    m = node.telemetry(2.0).metrics
    assert m["plan.parent_child"] == 0.0 and m["plan.x_order"] == 2.0
