"""``site_costs`` (STAR §IV-D2's latency tree): the plan key's schema, the spec every gateway builds from it,
and a gateway node refusing in prepare what it could not apply at commit."""

from __future__ import annotations

from typing import Any

import pytest

from gateways.config import GatewayConfig
from gateways.node import GatewayNode
from gateways.node.actions import ToScheduler
from gateways.node.plan_values import plan_problem, plan_spec
from gateways.rounds.config import RoundConfig
from gateways.rounds.topology import build_plan
from wanrt.errors import ConfigError
from wanrt.live_settings import (
    MAX_SITE_COSTS_CHARS,
    PLAN_KEYS,
    check_live_settings,
    format_site_costs,
    parse_site_costs,
    split_plan_values,
)
from wanrt.protocol.scheduler.messages import Announce, AnnounceReply

SITES = ("a", "b", "c", "d", "e")
TREE = RoundConfig(topology="tree")


def test_site_costs_is_a_plan_key_the_trainers_never_see() -> None:
    assert "site_costs" in PLAN_KEYS
    trainer, plan = split_plan_values({"site_costs": "a:1", "density": 0.1})
    assert trainer == {"density": 0.1} and plan == {"site_costs": "a:1"}


def test_costs_round_trip_through_the_canonical_string() -> None:
    costs = {"c": 0.5, "a": 0.123456, "b": 2.0}
    text = format_site_costs(costs)
    assert text == "a:0.123,b:2,c:0.5"  # sorted by site, three significant digits
    assert parse_site_costs(text) == {"a": 0.123, "b": 2.0, "c": 0.5}
    assert format_site_costs(parse_site_costs(text)) == text
    assert parse_site_costs(" b : 1e-3 , a:0 ") == {"a": 0.0, "b": 0.001}
    assert parse_site_costs("") == {}


@pytest.mark.parametrize(
    "value",
    ["a", "a:", ":1", "a:x", "a:1,a:2", "a:-1", "a:nan", "a:inf", "a:1e9", "a@b:1", "a:1,,b:2", 3, None],
)
def test_bad_site_costs_name_the_key(value: Any) -> None:
    with pytest.raises(ConfigError) as err:
        check_live_settings({"site_costs": value})
    assert err.value.key == "site_costs"


def test_site_costs_longer_than_an_announce_string_are_refused() -> None:
    text = ",".join(f"site{i:04d}:0.5" for i in range(MAX_SITE_COSTS_CHARS // 10 + 1))
    assert len(text) > MAX_SITE_COSTS_CHARS
    with pytest.raises(ConfigError) as err:
        parse_site_costs(text)
    assert err.value.key == "site_costs"


def test_an_unknown_site_is_a_config_error_naming_site_costs() -> None:
    with pytest.raises(ConfigError) as err:
        plan_spec({"site_costs": "a:1,z:2"}, TREE, None, SITES)
    assert err.value.key == "site_costs"
    assert plan_problem({"site_costs": "z:2"}, TREE, None, SITES) is not None


def test_costs_order_the_tree_and_the_configured_root_steps_aside() -> None:
    # name order with root a: a -> (b, c), b -> (d, e); b's link is the slow one
    costs = "a:0.2,b:1.0,c:0.2,d:0.2,e:0.2"
    spec = plan_spec({"site_costs": costs}, TREE, "a", SITES)
    assert spec is not None and spec.kind == "tree" and spec.root is None
    plan = build_plan(spec, SITES)
    assert plan.core == ("a",) and plan.children_of("b") == ()  # the slow site is a leaf
    # a key left out keeps the configured value: without costs the configured root and name order stay
    plain = plan_spec({"t_w_s": 0.1}, TREE, "a", SITES)
    assert plain is not None and build_plan(plain, SITES).children_of("b") == ("d", "e")
    # the cheapest site becomes the root, whatever the configured root
    moved = plan_spec({"site_costs": "a:1.0,b:0.1,c:0.2,d:0.2,e:0.2"}, TREE, "a", SITES)
    assert moved is not None and build_plan(moved, SITES).core == ("b",)
    assert build_plan(moved, SITES).children_of("a") == ()


def test_every_gateway_builds_the_same_spec_from_the_same_costs() -> None:
    values = {"site_costs": "e:0.3,a:0.9,b:0.1", "stragglers": ""}
    specs = {plan_spec(values, TREE, root, SITES) for root in (None, "a", "c")}
    assert len(specs) == 1  # the configured root does not enter a spec that carries costs
    (spec,) = specs
    assert spec is not None and dict(spec.costs) == {"a": 0.9, "b": 0.1, "e": 0.3}
    assert spec.cost("c") == float("inf")  # a site without a cost counts as the most expensive


def _node() -> GatewayNode:
    cfg = GatewayConfig(site="a", job="j", secret="x" * 32, rounds=RoundConfig(topology="star"))
    node = GatewayNode(cfg, 0.0)
    node.start(0.0)
    node.scheduler_connected(0.0)
    node.pop_actions()
    return node


def _replies(node: GatewayNode) -> list[AnnounceReply]:
    out = [a.msg for a in node.pop_actions() if isinstance(a, ToScheduler)]
    return [m for m in out if isinstance(m, AnnounceReply)]


def test_a_gateway_refuses_costs_for_a_site_it_does_not_know_and_accepts_its_own() -> None:
    node = _node()
    node.scheduler_message(Announce(1, "prepare", 10, {"site_costs": "a:0.1,q:0.2"}), 1.0)
    (bad,) = _replies(node)
    assert not bad.accepted and "site_costs" in bad.problem
    node.scheduler_message(Announce(2, "prepare", 10, {"site_costs": "a:0.1"}), 1.0)
    (good,) = _replies(node)
    assert good.accepted
    node.scheduler_message(Announce(2, "commit", 10, {"site_costs": "a:0.1"}), 1.0)
    assert node.engine is not None and dict(node.engine.plan_for(10).spec.costs) == {"a": 0.1}
