"""Local steps (ElasticBSP's ZipLine, docs/local_steps.md) end to end: the emulated-straggler demo at its
quick size with real scheduler and gateway daemons and trainer processes, the mitigated run with
``[scheduler.stragglers.local_steps] enabled``.

Two faults this catches, both seen in the first such run: the fast site's trainer leaving after 1/k of the
run (the demo counted optimizer steps, not WAN iterations) and ADJUST_BS re-balancing on top of the k's.
It checks behaviour, not speed: the k's were announced, no batch split came with them (and a learning-rate
scale only if the policy's default rule asks for one), every site trained the same WAN iterations and ended
with the same parameters, and the loss fell.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest

from scheduler.barrier.local_steps_policy import LocalStepsConfig
from wanrt.demo.runner import Demo

REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.slow


@pytest.mark.timeout(120)  # ~20 s; the two faults above made the run hang, not fail
def test_the_straggler_demo_runs_with_zipline_local_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sys.path.insert(0, str(REPO / "tools"))
    try:
        from bench_straggler_demo import _config
    finally:
        sys.path.remove(str(REPO / "tools"))
    cfg = dataclasses.replace(_config(True, 0), max_train_s=12.0)
    tables = Demo.straggler_tables

    def with_local_steps(c: Any) -> dict[str, dict[str, Any]]:
        return {**tables(c), "local_steps": {"enabled": True}}

    monkeypatch.setattr(Demo, "straggler_tables", staticmethod(with_local_steps))
    with Demo(cfg, tmp_path / "out", progress=False, on_line=lambda _line: None) as demo:
        run = demo.run("mitigated")
    values = [dict(d.values) for d in run.decisions if d.kind == "commit" and d.values]
    steps = {k: v for vals in values for k, v in vals.items() if k.startswith("local_steps@")}
    slow = str(cfg.straggler.site)
    fast = next(s for s in ("a", "b") if s != slow)
    assert steps.get(f"local_steps@{fast}", 1) > 1 and steps.get(f"local_steps@{slow}") == 1, values
    assert not any(k.startswith("batch_size@") for vals in values for k in vals), values
    # ADJUST_LR comes with the k's only if lr_scaling asks for it (default "none": docs/local_steps.md)
    scales = [vals["lr_scale"] for vals in values if "lr_scale" in vals]
    assert bool(scales) == (LocalStepsConfig().lr_scaling != "none"), values
    assert run.distinct_final_models == 1
    assert run.iterations >= 10
    assert run.curve[-1].loss < 0.8 * run.curve[0].loss
