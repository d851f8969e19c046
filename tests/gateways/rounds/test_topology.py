"""Plans are valid, deterministic, and put slow sites where STAR puts them."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateways.rounds.topology import Plan, PlanSpec, build_plan
from wanrt.errors import ConfigError

SITES = [f"s{i:02d}" for i in range(12)]


def _depth(plan: Plan, s: str) -> int:
    d = 0
    while (p := plan.parent_of(s)) is not None:
        s, d = p, d + 1
    return d


def test_star_root_is_the_cheapest_site() -> None:
    spec = PlanSpec.make("star", costs={"a": 3.0, "b": 1.0, "c": 2.0, "d": 9.0})
    plan = build_plan(spec, "abcd")
    assert plan.core == ("b",)
    assert all(plan.parent_of(s) == "b" for s in "acd")
    assert plan.children_of("b") == ("a", "c", "d")


def test_tree_places_expensive_sites_lower_and_respects_arity() -> None:
    costs = {s: float(i) for i, s in enumerate(reversed(SITES))}  # s11 cheapest ... s00 dearest
    for arity in (1, 2, 3, 5):
        plan = build_plan(PlanSpec.make("tree", arity=arity, costs=costs), SITES)
        assert plan.core == ("s11",)
        for s in SITES:
            assert len(plan.children_of(s)) <= arity
        # depth never decreases with cost (STAR §IV-D2: long-latency workers in lower layers)
        by_cost = sorted(SITES, key=costs.__getitem__)
        depths = [_depth(plan, s) for s in by_cost]
        assert depths == sorted(depths)
        assert plan.height_of("s11") == max(depths)


def test_tree_uses_pairwise_links_to_pick_parents() -> None:
    costs = {"r": 0.0, "p1": 1.0, "p2": 1.0, "c1": 5.0, "c2": 5.0}
    links = {("c1", "p2"): 0.1, ("c2", "p1"): 0.1, ("c1", "p1"): 9.0, ("c2", "p2"): 9.0}
    plan = build_plan(PlanSpec.make("tree", arity=2, costs=costs, link_costs=links), costs)
    assert plan.parent_of("c1") == "p2" and plan.parent_of("c2") == "p1"


def test_ring_and_parent_child() -> None:
    ring = build_plan(PlanSpec.make("ring"), "dcba")
    assert ring.core == ("a", "b", "c", "d") and not ring.parents
    assert ring.ring_next("d") == "a" and ring.ring_prev("a") == "d"
    spec = PlanSpec.make("parent_child", costs={"e": 9.0, "f": 8.0, "g": 7.0}, stragglers=["e", "f", "g"])
    pc = build_plan(spec, "abcdefg")
    assert pc.core == ("a", "b", "c", "d")
    assert pc.waits_tw == {"e", "f", "g"}
    # STAR §IV-D1: each child picks the ring member with the fewest children -> one each
    assert sorted(pc.parent_of(s) or "" for s in "efg") == ["a", "b", "c"]
    assert pc.neighbours("a") == ("b", "d", "e")


def test_stragglers_in_a_star_wait_t_w_and_everyone_straggling_means_none() -> None:
    star = build_plan(PlanSpec.make("star", stragglers=["c"]), "abc")
    assert star.waits_tw == {"c"} and star.parent_of("c") == "a"
    alls = build_plan(PlanSpec.make("ring", stragglers=["a", "b"]), "ab")
    assert alls.core == ("a", "b") and not alls.waits_tw


def test_deterministic_across_input_orders() -> None:
    costs = {s: random.Random(1).random() for s in SITES}
    items = list(costs.items())
    plans = set()
    for seed in range(5):
        random.Random(seed).shuffle(items)
        members = SITES[:]
        random.Random(seed + 100).shuffle(members)
        spec = PlanSpec.make("tree", arity=3, costs=dict(items), stragglers=["s03", "s07"])
        plans.add((build_plan(spec, members).plan_id, hash(spec)))
    assert len(plans) == 1


def test_replan_after_loss_and_rejoin() -> None:
    spec = PlanSpec.make("tree", arity=2, costs={s: float(i) for i, s in enumerate(SITES)})
    full = build_plan(spec, SITES)
    lost = build_plan(spec, [s for s in SITES if s != "s00"])  # the root is lost
    assert lost.core == ("s01",) and "s00" not in lost.members
    assert lost.plan_id != full.plan_id
    assert build_plan(spec, SITES).plan_id == full.plan_id


def test_invalid_specs_and_plans() -> None:
    with pytest.raises(ConfigError) as err:
        PlanSpec.make("tree", arity=0)
    assert err.value.fields["key"] == "arity"
    with pytest.raises(ConfigError):
        PlanSpec.make("mesh")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        PlanSpec.make("tree", costs={"a": float("nan")})
    spec = PlanSpec()
    with pytest.raises(ConfigError):  # a cycle that never reaches the core
        Plan(spec, ("a", "b", "c"), ("a",), (("b", "c"), ("c", "b")), frozenset())
    with pytest.raises(ConfigError):  # a member without a parent
        Plan(spec, ("a", "b"), ("a",), (), frozenset())


@given(
    n=st.integers(1, 40),
    kind=st.sampled_from(["star", "tree", "ring", "parent_child", "allpairs"]),
    arity=st.integers(1, 5),
    seed=st.integers(0, 2**31),
)
def test_every_plan_is_valid(n: int, kind: str, arity: int, seed: int) -> None:
    rng = random.Random(seed)
    members = [f"x{i}" for i in range(n)]
    costs = {s: rng.random() for s in members if rng.random() < 0.8}
    stragglers = [s for s in members if rng.random() < 0.2]
    spec = PlanSpec.make(kind, arity=arity, costs=costs, stragglers=stragglers)  # type: ignore[arg-type]
    plan = build_plan(spec, members)
    assert set(plan.members) == set(members)
    for s in members:  # everybody reaches the core
        seen = 0
        while not plan.in_core(s):
            s = plan.parent_of(s) or ""
            seen += 1
            assert seen <= n
    for c in plan.waits_tw:
        assert not plan.children_of(c)  # stragglers are leaves
    if kind == "tree":
        for s in members:
            normal_children = [c for c in plan.children_of(s) if c not in plan.waits_tw]
            assert len(normal_children) <= arity
    assert build_plan(spec, reversed(members)).plan_id == plan.plan_id


def test_allpairs_core_talks_to_every_member_and_hosts_stragglers() -> None:
    plan = build_plan(PlanSpec.make("allpairs", stragglers=["e"], costs={"e": 9.0}), "edcba")
    assert plan.core == ("a", "b", "c", "d") and plan.all_pairs
    assert plan.parent_of("e") == "a" and plan.waits_tw == {"e"}
    assert plan.neighbours("a") == ("b", "c", "d", "e")
    assert plan.neighbours("c") == ("a", "b", "d")
    assert plan.neighbours("e") == ("a",)
    ring = build_plan(PlanSpec.make("ring"), "abcd")
    assert not ring.all_pairs and ring.plan_id != build_plan(PlanSpec.make("allpairs"), "abcd").plan_id
