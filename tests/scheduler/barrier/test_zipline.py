"""ZipLine and its baselines against the naive R^n search (seed 003 §5), on random and tie-heavy cases."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from scheduler.barrier import (
    full_grid_scan,
    grid_scan,
    naive_search,
    zipline,
    zipline_opt,
    zipline_opt_bs,
    zipline_scan,
)
from wanrt.errors import ConfigError

EXACT = (zipline, zipline_scan, zipline_opt, zipline_opt_bs, full_grid_scan)


def paper_dataset(n: int, r: int, rng: np.random.Generator) -> np.ndarray:
    """§6.1's generator: intervals U[1000, 1500] ms, starts U[10, 50] ms; the workers run ~10 iterations
    (so their phases spread out, as the paper's two-stage generator does), then R ends are predicted."""
    iv = rng.uniform(1000, 1500, n)
    start = rng.uniform(10, 50, n)
    last = start + np.floor((15_000 - start) / iv) * iv
    return last[:, None] + iv[:, None] * np.arange(1, r + 1)


@st.composite
def small_ends(draw: st.DrawFn) -> np.ndarray:
    """n × R predicted ends, rows sorted; small integers on purpose, so ties are frequent."""
    n = draw(st.integers(1, 4))
    r = draw(st.integers(1, 5))
    hi = draw(st.sampled_from([3, 10, 1000]))
    vals = draw(arrays(np.int64, (n, r), elements=st.integers(0, hi)))
    return np.sort(vals, axis=1).astype(np.float64)


@given(small_ends())
def test_exact_methods_find_the_naive_optimum(ends: np.ndarray) -> None:
    ref = naive_search(ends)
    for method in EXACT:
        got = method(ends)
        assert got.key == ref.key, method.__name__
        # the returned set is a real candidate: one element per worker, with the cost it claims
        assert got.arrivals == tuple(ends[np.arange(ends.shape[0]), np.array(got.iterations) - 1])
        assert got.wait == pytest.approx(max(got.arrivals) - min(got.arrivals))
        assert got.t_sync == max(got.arrivals)


@given(small_ends())
def test_grid_scan_is_never_better_than_the_optimum(ends: np.ndarray) -> None:
    assert grid_scan(ends).key >= naive_search(ends).key


def test_grid_scan_misses_the_optimum_sometimes() -> None:
    """The paper's point about GridScan (§6.1.1): it only looks around one designated row."""
    rng = np.random.default_rng(3)
    misses = 0
    for _ in range(20):
        ends = paper_dataset(20, 15, rng)
        misses += grid_scan(ends).wait > zipline(ends).wait + 1e-9
    assert misses > 0


def test_paper_dataset_shape_all_variants_agree() -> None:
    ends = paper_dataset(200, 15, np.random.default_rng(0))
    ref = full_grid_scan(ends)
    for method in (zipline, zipline_scan, zipline_opt, zipline_opt_bs):
        assert method(ends).key == ref.key


def test_earliest_barrier_wins_ties() -> None:
    """Corollary 1: two sets with equal d_Z — the earlier barrier is chosen."""
    ends = np.array([[0.0, 10.0], [1.0, 11.0]])
    for method in EXACT:
        choice = method(ends)
        assert (choice.wait, choice.t_sync) == (1.0, 1.0), method.__name__
        assert choice.iterations == (1, 1)


def test_hand_example() -> None:
    # worker 0 every 3, worker 1 every 5: ends 3 6 9 12 / 5 10 15 20 → closest pair (9, 10) or (6, 5)
    ends = np.array([[3.0, 6.0, 9.0, 12.0], [5.0, 10.0, 15.0, 20.0]])
    choice = zipline(ends)
    assert choice.wait == 1.0
    assert choice.t_sync == 6.0  # (6, 5) comes before (9, 10)
    assert choice.iterations == (2, 1)
    assert choice.total_wait == 1.0


def test_single_worker_syncs_after_its_first_iteration() -> None:
    choice = zipline([[4.0, 8.0, 12.0]])
    assert (choice.wait, choice.t_sync, choice.iterations) == (0.0, 4.0, (1,))


@pytest.mark.parametrize(
    "bad",
    [
        np.zeros((0, 3)),
        np.zeros(3),
        np.array([[1.0, np.nan]]),
        np.array([[2.0, 1.0]]),
    ],
)
def test_bad_input_is_a_config_error(bad: np.ndarray) -> None:
    for method in (*EXACT, grid_scan):
        with pytest.raises(ConfigError) as exc:
            method(bad)
        assert exc.value.fields["key"] == "ends"


def test_naive_search_refuses_huge_cases() -> None:
    with pytest.raises(ConfigError):
        naive_search(np.tile(np.arange(10.0), (8, 1)))
