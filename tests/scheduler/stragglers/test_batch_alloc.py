"""AntDT Eq. 3 and Eq. 4 allocations against exhaustive enumeration on tiny cases."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.stragglers import (
    DeviceGroup,
    allocate_accumulation,
    allocate_continuous,
    allocate_greedy,
    allocate_milp,
    makespan,
)
from wanrt.errors import ConfigError


@st.composite
def eq3_case(draw: st.DrawFn) -> tuple[np.ndarray, int, np.ndarray, np.ndarray]:
    n = draw(st.integers(1, 3))
    v = np.array(draw(st.lists(st.floats(0.2, 5.0), min_size=n, max_size=n)))
    lo = np.array(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)))
    hi = lo + np.array(draw(st.lists(st.integers(0, 8), min_size=n, max_size=n)))
    total = draw(st.integers(int(lo.sum()), int(hi.sum())))
    return v, total, lo, hi


def enumerate_eq3(v: np.ndarray, total: int, lo: np.ndarray, hi: np.ndarray) -> float:
    ranges = [range(int(a), int(b) + 1) for a, b in zip(lo, hi, strict=True)]
    return min(makespan(c, v) for c in itertools.product(*ranges) if sum(c) == total)


@given(eq3_case())
def test_greedy_is_optimal(case: tuple[np.ndarray, int, np.ndarray, np.ndarray]) -> None:
    v, total, lo, hi = case
    b = allocate_greedy(v, total, lo, hi)
    assert b.sum() == total
    assert np.all(b >= lo) and np.all(b <= hi)
    assert makespan(b, v) == pytest.approx(enumerate_eq3(v, total, lo, hi), rel=1e-12)


@settings(max_examples=40)
@given(eq3_case())
def test_milp_is_optimal(case: tuple[np.ndarray, int, np.ndarray, np.ndarray]) -> None:
    v, total, lo, hi = case
    b = allocate_milp(v, total, lo, hi)
    assert b.sum() == total
    assert np.all(b >= lo) and np.all(b <= hi)
    assert makespan(b, v) == pytest.approx(enumerate_eq3(v, total, lo, hi), rel=1e-9)


def test_continuous_is_proportional_to_throughput() -> None:
    b = allocate_continuous([1.0, 2.0, 5.0], 80)
    np.testing.assert_allclose(b, [10.0, 20.0, 50.0])
    # every rank then takes the same time: the min–max optimum of Eq. 2
    np.testing.assert_allclose(b / np.array([1.0, 2.0, 5.0]), 10.0)


def test_continuous_respects_bounds_by_water_filling() -> None:
    b = allocate_continuous([1.0, 1.0, 10.0], 60, lo=0, hi=[100, 100, 30])
    np.testing.assert_allclose(b, [15.0, 15.0, 30.0])


def test_greedy_matches_milp_at_moderate_size() -> None:
    rng = np.random.default_rng(4)
    v = rng.uniform(1000, 5000, 40)
    g = allocate_greedy(v, 40 * 512, 1, 4096)
    m = allocate_milp(v, 40 * 512, 1, 4096)
    assert makespan(g, v) == pytest.approx(makespan(m, v), rel=1e-9)


def test_infeasible_bounds_name_the_global_batch() -> None:
    with pytest.raises(ConfigError) as exc:
        allocate_greedy([1.0, 1.0], 100, lo=0, hi=10)
    assert exc.value.fields["key"] == "global_batch"
    with pytest.raises(ConfigError):
        allocate_milp([1.0, -1.0], 10)


def enumerate_eq4(groups: list[DeviceGroup], total: int, cmin: int, cmax: int) -> float:
    best = np.inf
    options = [
        [(c, b) for c in range(cmin, cmax + 1) for b in range(g.min_batch, g.max_batch + 1)] for g in groups
    ]
    for combo in itertools.product(*options):
        if sum(g.count * c * b for g, (c, b) in zip(groups, combo, strict=True)) == total:
            best = min(best, max(c * b / g.throughput for g, (c, b) in zip(groups, combo, strict=True)))
    return best


@settings(max_examples=30)
@given(
    st.lists(
        st.tuples(st.integers(1, 3), st.floats(0.5, 4.0), st.integers(1, 3), st.integers(0, 3)),
        min_size=1,
        max_size=2,
    ),
    st.integers(1, 3),
    st.integers(0, 2),
    st.integers(1, 40),
)
def test_eq4_milp_matches_enumeration(
    raw: list[tuple[int, float, int, int]], cmin: int, cspan: int, total: int
) -> None:
    groups = [DeviceGroup(n, v, lo, lo + extra) for n, v, lo, extra in raw]
    best = enumerate_eq4(groups, total, cmin, cmin + cspan)
    if not np.isfinite(best):
        with pytest.raises(ConfigError):
            allocate_accumulation(groups, total, min_steps=cmin, max_steps=cmin + cspan)
        return
    plan = allocate_accumulation(groups, total, min_steps=cmin, max_steps=cmin + cspan)
    assert sum(g.count * c * b for g, c, b in zip(groups, plan.steps, plan.batch, strict=True)) == total
    for g, c, b in zip(groups, plan.steps, plan.batch, strict=True):
        assert g.min_batch <= b <= g.max_batch
        assert cmin <= c <= cmin + cspan
    assert plan.makespan == pytest.approx(best, rel=1e-9)


def test_eq4_uses_accumulation_when_memory_binds() -> None:
    """V100 3× faster than P100 but both limited to 64-sample micro-batches: the V100s accumulate."""
    groups = [DeviceGroup(4, 300.0, 8, 64), DeviceGroup(4, 100.0, 8, 64)]
    plan = allocate_accumulation(groups, 448, max_steps=5)
    assert plan.makespan == pytest.approx(0.28)  # 84 samples per V100, 28 per P100: both 0.28 s
    assert plan.steps[0] > 1  # one micro-batch of ≤ 64 cannot carry a V100's share
    # without accumulation the V100s are capped at 64 and the P100s must take the rest (48 each)
    single = allocate_accumulation(groups, 448, max_steps=1)
    assert single.makespan == pytest.approx(0.48)
