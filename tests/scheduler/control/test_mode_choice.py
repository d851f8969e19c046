"""The mode choice's cost model and chooser (issue 23 item 4, docs/scheduler.md "The mode choice"):
monotone in the bandwidth, never a mode the model predicts slower than another (beyond the switch
hysteresis), a re-plan only on a real change, and the payload bytes the codec sends."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.control.mode_choice import ModeChooser, best_candidate
from scheduler.control.mode_config import ModeConfig
from scheduler.control.mode_cost import LinkState, candidates, index_bytes, payload_bytes, value_bytes
from wanrt.errors import ConfigError

CFG = ModeConfig(
    enabled=True,
    steps_factor={
        "fp32": (1.05, 1.1, 1.2, 1.3, 2.0),
        "int8": (1.1, 1.2, 1.4, 2.0, 3.0),
        "int4": (1.1, 1.2, 1.4, 2.0, 3.0),
        "int2": (1.2, 1.3, 1.5, 2.2, 3.5),
    },
)

bandwidths = st.floats(1e5, 1e10)
states = st.builds(
    LinkState,
    bandwidth_bps=bandwidths,
    compute_s=st.floats(1e-3, 5.0),
    n_params=st.integers(1_000, 100_000_000),
    sites=st.integers(2, 8),
    latency_s=st.floats(0.0, 0.5),
    per_step_density=st.floats(0.001, 1.0),
    staleness=st.integers(0, 1),
)


def _at(s: LinkState, bandwidth: float) -> LinkState:
    return LinkState(
        bandwidth, s.compute_s, s.n_params, s.sites, s.latency_s, s.per_step_density, s.staleness
    )


@given(states, bandwidths)
def test_the_best_cost_never_rises_with_the_bandwidth(s: LinkState, other: float) -> None:
    lo, hi = sorted((s.bandwidth_bps, other))
    slow = best_candidate(candidates(_at(s, lo), CFG))
    fast = best_candidate(candidates(_at(s, hi), CFG))
    assert fast.cost_s <= slow.cost_s * (1 + 1e-12)
    for a, b in zip(candidates(_at(s, lo), CFG), candidates(_at(s, hi), CFG), strict=True):
        assert b.cost_s <= a.cost_s * (1 + 1e-12)  # every mode's own prediction too


@given(states, bandwidths)
def test_diloco_takes_no_larger_h_on_a_faster_link(s: LinkState, other: float) -> None:
    cfg = ModeConfig(modes=("diloco",), codings=("int2",), steps_factor=CFG.steps_factor)
    lo, hi = sorted((s.bandwidth_bps, other))
    slow = best_candidate(candidates(_at(s, lo), cfg))
    fast = best_candidate(candidates(_at(s, hi), cfg))
    assert fast.outer_steps <= slow.outer_steps


@given(states)
def test_the_choice_is_never_predicted_slower_than_another_mode(s: LinkState) -> None:
    cands = candidates(s, CFG)
    best = best_candidate(cands)
    assert all(best.cost_s <= c.cost_s for c in cands)
    plan = ModeChooser(CFG).plan(s, 0.0)
    assert plan is not None and plan.label == best.label and plan.predicted_cost_s == best.cost_s
    assert {lab for lab, _ in plan.alternatives} >= {best.label}


@settings(max_examples=200)
@given(states, st.lists(st.floats(0.2, 5.0), min_size=1, max_size=6))
def test_a_kept_mode_is_within_the_switch_gain_of_the_best(s: LinkState, moves: list[float]) -> None:
    chooser = ModeChooser(CFG)
    first = chooser.plan(s, 0.0)
    assert first is not None
    chooser.confirm(10)
    state = s
    for k, m in enumerate(moves):
        state = _at(state, state.bandwidth_bps * m)
        chooser.plan(state, float(k + 1))
        if chooser.pending is not None:
            chooser.confirm(20 + k)
        cur = chooser.current
        assert cur is not None
        cands = candidates(state, CFG)
        mine = next(c for c in cands if c.label == cur.label)
        if cur.bandwidth_bps == state.bandwidth_bps:  # planned at this state (a re-plan was due)
            assert mine.cost_s <= best_candidate(cands).cost_s * (1 + CFG.switch_gain) * (1 + 1e-12)


def test_a_small_change_does_not_replan_and_a_large_one_does() -> None:
    s = LinkState(100e6, 0.06, 4_350_000, 3, 0.04, 0.02)
    chooser = ModeChooser(CFG)
    first = chooser.plan(s, 0.0)
    assert first is not None and first.reason == "initial"
    assert chooser.confirm(40) is not None and chooser.current is not None
    assert chooser.current.effective_iteration == 40
    assert chooser.plan(_at(s, 90e6), 1.0) is None  # 10 %: below replan_change
    slow = chooser.plan(_at(s, 1e6), 2.0)
    assert slow is not None and slow.reason == "bandwidth_change"
    assert slow.outer_steps > 1 and slow.mode != "per_step"  # a 1 Mbit/s link: an outer loop pays
    fast = LinkState(100e9, 0.06, 4_350_000, 3, 0.0, 0.02)
    assert best_candidate(candidates(fast, CFG)).mode == "per_step"  # a LAN: exchange every step


def test_payload_bytes_are_the_codecs() -> None:
    # tools/bench_lowbit.py measured at density 1 %, block 16: fp32 4.0795, int8 1.1259, int4 0.6259,
    # int2 0.3759 bytes per selected value, index included
    per = {c: payload_bytes(1e6, 0.01, c, CFG) / 1e4 for c in ("fp32", "int8", "int4", "int2")}
    assert per["fp32"] == pytest.approx(4.0795, abs=0.002)
    assert per["int8"] == pytest.approx(1.1259, abs=0.002)
    assert per["int4"] == pytest.approx(0.6259, abs=0.002)
    assert per["int2"] == pytest.approx(0.3759, abs=0.002)
    assert index_bytes(1.0, "int2", 16) == 0.0 and value_bytes("fp16", 16) == 2.0


def test_streaming_fragments_stay_within_h_and_its_bytes_are_diloco_s() -> None:
    cfg = ModeConfig(outer_steps=(2, 4), fragments=(2, 4), steps_factor={c: (1.0, 1.0) for c in CFG.codings})
    s = LinkState(10e6, 0.05, 1_000_000, 3)
    cands = candidates(s, cfg)
    assert {(c.outer_steps, c.fragments) for c in cands if c.mode == "streaming"} == {(2, 2), (4, 2), (4, 4)}
    for c in cands:
        if c.mode == "streaming":  # F fragments of N/F values each: DiLoCo's bytes per H steps
            same = next(
                d
                for d in cands
                if d.mode == "diloco" and (d.outer_steps, d.coding) == (c.outer_steps, c.coding)
            )
            assert c.bytes_per_step == pytest.approx(same.bytes_per_step)
            assert c.iteration_s <= same.iteration_s * (1 + 1e-12)  # the overlap never costs time


@pytest.mark.parametrize(
    ("kw", "key"),
    [
        ({"modes": ("ring",)}, "modes"),
        ({"outer_steps": (1, 4)}, "outer_steps"),
        ({"outer_steps": (8, 4)}, "outer_steps"),
        ({"fragments": (1,)}, "fragments"),
        ({"codings": ("bf16",)}, "codings"),
        ({"steps_factor": {"fp32": (1.0,)}}, "steps_factor.fp32"),
        ({"switch_gain": -1.0}, "switch_gain"),
    ],
)
def test_a_bad_config_is_refused_by_name(kw: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        ModeConfig(**kw)  # type: ignore[arg-type]
    assert err.value.fields["key"] == key
