"""tools/bench_kill_restart.py's keys from one run's records (synthetic records: the run itself is
tests/scheduler/service/test_kill_restart_e2e.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

from bench_kill_restart import KEYS, facts

from tools.harness.kill_restart_scenario import STEPS, Run


def _run(b_digest: str = "d") -> Run:
    # site b: 0.3 s iterations until the order's iteration 10 (+ the restart gap), then 0.01 s
    ends, t = [], 100.0
    for i in range(STEPS):
        t += 0.3 if i < 12 else (2.0 if i == 12 else 0.01)
        ends.append(t)
    results = {
        "a0-0": {"ended": "restart", "t_exit": 103.5},
        "a0-1": {"ended": "done", "t_start": 105.0, "t_params": 105.5, "digest": "d"},
        "b0-0": {"ended": "done", "step_ends": ends, "digest": b_digest},
    }
    decisions = [
        {"kind": "tick", "monotonic": 101.0},
        {"kind": "commit", "monotonic": 102.0, "values": {"restart@a": 0}},
    ]
    restarts = [{"site": "a", "rank": 0, "decision": 1, "effective_iteration": 10}]
    return Run({"a": 0, "b": 0}, results, restarts, None, decisions, {}, STEPS - 1, "")  # type: ignore[arg-type]


def test_the_keys_come_from_the_records() -> None:
    f = facts(_run(), 1)
    assert set(KEYS) <= set(f)
    assert f["order_to_exit_s"] == pytest.approx(1.5)
    assert f["exit_to_restart_s"] == pytest.approx(1.5)
    assert f["restart_to_params_s"] == pytest.approx(0.5)
    assert f["order_to_rejoin_s"] == pytest.approx(3.5)
    assert f["it_s_with_bad_node"] == pytest.approx(0.3)
    assert f["it_s_after_restart"] == pytest.approx(0.01)
    assert f["speedup"] == pytest.approx(30.0)
    assert (f["params_equal"], f["orders"], f["rounds_lost"]) == (1, 1, 0)
    assert facts(_run(b_digest="other"), 1)["params_equal"] == 0


def test_a_failed_run_is_reported_not_measured() -> None:
    run = _run()
    run.codes = {"a": 1, "b": 0}
    assert facts(run, 1)["failed"] is True
