"""STAR §IV-D2 latency tree: slow sites low, fan-out bounded, cheap links preferred."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.stragglers import latency_tree, tree_depths
from wanrt.errors import ConfigError


@given(
    st.dictionaries(
        st.text("abcdefghij", min_size=1, max_size=3), st.floats(0.0, 10.0), min_size=1, max_size=30
    ),
    st.integers(1, 4),
)
def test_slow_sites_sit_no_higher_than_faster_ones(costs: dict[str, float], arity: int) -> None:
    parents = latency_tree(costs, arity)
    depth = tree_depths(parents)
    assert set(parents) == set(costs)
    assert sum(p is None for p in parents.values()) == 1
    for a in costs:
        for b in costs:
            if costs[a] < costs[b]:
                assert depth[a] <= depth[b]
    children: dict[str, int] = {}
    for p in parents.values():
        if p is not None:
            children[p] = children.get(p, 0) + 1
    assert max(children.values(), default=0) <= arity


def test_pairwise_link_costs_choose_the_parent() -> None:
    costs = {"root": 0.0, "a": 1.0, "b": 1.1, "x": 5.0, "y": 5.5}
    links = {("a", "x"): 9.0, ("b", "x"): 1.0, ("a", "y"): 1.0, ("b", "y"): 9.0}
    parents = latency_tree(costs, 2, links)
    assert parents == {"root": None, "a": "root", "b": "root", "x": "b", "y": "a"}


def test_explicit_root() -> None:
    parents = latency_tree({"a": 1.0, "b": 2.0, "c": 3.0}, 2, root="c")
    assert parents["c"] is None


def test_bad_inputs() -> None:
    with pytest.raises(ConfigError):
        latency_tree({}, 2)
    with pytest.raises(ConfigError):
        latency_tree({"a": float("nan")}, 2)
    with pytest.raises(ConfigError):
        latency_tree({"a": 1.0}, 2, root="z")
    with pytest.raises(ConfigError):
        tree_depths({"a": "b", "b": "a"})
