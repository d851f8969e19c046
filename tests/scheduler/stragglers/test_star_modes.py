"""STAR's Eq. 1–3 mode choice against a brute-force grid, the formulas by hand, the t_w U shape."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.stragglers import ModeConfig, brute_force_mode, choose_mode, scaled_lr, tw_sweep
from scheduler.stragglers.star_modes import (
    dynamic_x_order,
    evaluate_mode,
    parent_child_time,
    predicted_stragglers,
    static_x_order,
)
from wanrt.errors import ConfigError

ALL = ("bsp", "x_order", "dynamic", "parent_child")
MODE_SETS = [ALL, ("bsp", "x_order", "parent_child"), ("bsp", "parent_child"), ("bsp", "dynamic")]


@st.composite
def scenario(draw: st.DrawFn) -> tuple[list[float], float, float, list[float] | None]:
    """Integer-millisecond times (so every lateness lies on the 1 ms t_w grid), φ over four decades."""
    n = draw(st.integers(2, 7))
    times = [float(draw(st.integers(100, 600))) for _ in range(n)]
    m = float(n * draw(st.sampled_from([16, 64, 256])))
    phi = m * draw(st.floats(0.01, 100.0))
    child = None
    if draw(st.booleans()):  # STAR's premise: a straggler off the ring is faster as a child
        child = [float(max(1, t - draw(st.integers(0, 300)))) for t in times]
    return times, phi, m, child


@settings(max_examples=150)
@given(scenario(), st.sampled_from(MODE_SETS))
def test_choice_equals_the_grid_argmin(
    case: tuple[list[float], float, float, list[float] | None], modes: tuple[str, ...]
) -> None:
    times, phi, m, child = case
    cfg = ModeConfig(modes=modes, max_wait_s=400.0)  # type: ignore[arg-type]
    chosen = choose_mode(times, phi, m, cfg, child_times=child, max_wait=400.0)
    grid = brute_force_mode(times, phi, m, np.arange(0.0, 401.0), cfg, child_times=child)
    assert chosen.same_as(grid), (chosen, grid)
    assert chosen.kind in modes
    # the reported time is what Eq. 1–3 give for the chosen mode
    assert evaluate_mode(chosen, times, phi, m, child) == pytest.approx(chosen.time, rel=1e-12)


def test_equations_by_hand() -> None:
    times = [100.0, 100.0, 200.0, 400.0]
    phi, m, n = 120.0, 40.0, 4
    # Eq. 1: x = 2 uses the 2 fastest: (1 + φ/(2·M/N))·t_2
    x2 = static_x_order(times, phi, m)[1]
    assert x2.time == pytest.approx((1 + 120 / (2 * 10)) * 100)
    # Eq. 2 with clusters {100, 100}, {200}, {400}: 1 / Σ 1/((1 + φ/(n_c·M/N))·t_c)
    rates = 1 / ((1 + 120 / 20) * 100) + 1 / ((1 + 120 / 10) * 200) + 1 / ((1 + 120 / 10) * 400)
    dyn = dynamic_x_order(times, phi, m)
    assert dyn is not None
    assert dyn.time <= 1 / rates + 1e-12  # the DP's clustering is at least as good as this one
    # Eq. 3: remove the slowest (x = 1), wait 150 for it: it arrives (lateness 400 − 200 = 200 > 150) → q = 0
    t_a, q = parent_child_time(times, phi, m, 1, 150.0)
    assert (t_a, q) == (pytest.approx((1 + 120 / (3 * 10)) * 350), 0)
    t_a, q = parent_child_time(times, phi, m, 1, 200.0)
    assert (t_a, q) == (pytest.approx((1 + 120 / (4 * 10)) * 400), 1)
    assert n == len(times)


def test_no_predicted_straggler_means_bsp() -> None:
    times = [100.0, 105.0, 110.0]  # deviation ≤ 20 %
    assert predicted_stragglers(times, 0.2) == []
    assert choose_mode(times, 1e6, 30.0, ModeConfig(modes=ALL)).kind == "bsp"  # type: ignore[arg-type]


def test_noisy_gradients_favour_waiting_for_everyone() -> None:
    """Large φ: every report is worth its wait (n_u ∝ 1/y), so a mild straggler is waited for."""
    times = [100.0, 100.0, 100.0, 130.0]
    assert choose_mode(times, 1e7, 40.0, ModeConfig()).kind == "bsp"
    assert choose_mode(times, 0.0, 40.0, ModeConfig()).kind == "x_order"  # no noise: the fastest suffice


def test_tw_sweep_is_u_shaped_when_children_are_close() -> None:
    """Ring at 300 ms; two stragglers off the ring arrive 20 and 40 ms after it (STAR §IV-B)."""
    times = [300.0] * 6 + [450.0, 500.0]
    child = [300.0] * 6 + [320.0, 340.0]
    waits = np.arange(0.0, 301.0, 10.0)
    sweep = tw_sweep(times, 8000.0, 1024.0, 2, waits, child)
    best = int(np.argmin(sweep))
    assert 0 < best < len(waits) - 1
    assert waits[best] == 40.0
    assert sweep[0] > sweep[best] and sweep[-1] > sweep[best]
    chosen = choose_mode(times, 8000.0, 1024.0, ModeConfig(max_wait_s=300.0), child_times=child)
    assert (chosen.kind, chosen.order, chosen.wait) == ("parent_child", 2, 40.0)


def test_scaled_lr_follows_the_update_batch() -> None:
    assert scaled_lr(0.1, 4, 8) == pytest.approx(0.05)
    assert scaled_lr(0.1, 8, 8) == pytest.approx(0.1)


def test_bad_inputs() -> None:
    with pytest.raises(ConfigError):
        choose_mode([], 1.0, 10.0)
    with pytest.raises(ConfigError):
        choose_mode([1.0, -1.0], 1.0, 10.0)
    with pytest.raises(ConfigError):
        choose_mode([1.0, 2.0], float("nan"), 10.0)
    with pytest.raises(ConfigError):
        ModeConfig(modes=("x_order",))  # bsp must stay available
