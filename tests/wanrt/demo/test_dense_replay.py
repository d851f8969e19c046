"""The dense replay: when and how the demo counts a budget-stopped dense arm's iterations to the target."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from gateways.config import load_gateway_config
from wanrt.demo.config import DEFAULT, QUICK, DemoConfig
from wanrt.demo.results import CurvePoint, RunResult
from wanrt.demo.runner import Demo
from wanrt.demo.sites.config_files import UNSHAPED_RATE_BPS, write_run_files, write_secret
from wanrt.errors import ConfigError


def _dense(*, reached: bool, budget_s: float | None) -> RunResult:
    return RunResult(
        mode="dense",
        iterations=8,
        target_loss=0.1,
        tta_s=30.0 if reached else None,
        iters_to_target=8 if reached else None,
        train_s=61.0,
        final_loss=1.5,
        final_accuracy=0.8,
        curve=(CurvePoint(0.0, 0, 2.3, 0.1),),
        step_times=(),
        wan_bytes_sent=1,
        wan_bytes_received=1,
        bytes_sent_per_site={"a": 1},
        rounds_completed={"a": 8},
        distinct_final_models=1,
        budget_s=budget_s,
    )


def test_the_replay_is_on_by_default_with_a_dense_budget_and_validated() -> None:
    assert DEFAULT.dense_budget_s > 0 and DEFAULT.dense_replay_max_iters > 0
    assert QUICK.dense_budget_s == 0  # --quick's dense arm reaches the target itself: nothing to replay
    assert DEFAULT.shaping and QUICK.shaping
    with pytest.raises(ConfigError):
        DemoConfig(dense_replay_max_iters=-1)


def test_the_replay_runs_the_dense_arm_on_unshaped_links_until_the_target_or_its_cap(tmp_path: Path) -> None:
    demo = Demo(DEFAULT, tmp_path, progress=False, on_line=lambda _: None)
    calls: list[tuple[str, dict[str, Any]]] = []

    def run(mode: str, **kw: Any) -> RunResult:
        calls.append((mode, kw))
        return _dense(reached=True, budget_s=None)

    demo.run = run  # type: ignore[method-assign]
    assert demo.replay_dense(_dense(reached=True, budget_s=60.0)) is None  # reached: its own count stands
    assert demo.replay_dense(_dense(reached=False, budget_s=None)) is None  # max_iters stopped it, no budget
    assert calls == []
    assert demo.replay_dense(_dense(reached=False, budget_s=60.0)) is not None
    ((mode, kw),) = calls
    links: DemoConfig = kw["links"]
    assert mode == "dense" and kw["label"] == "dense-replay"
    assert not links.shaping and not links.fluctuating and links.dense_budget_s == 0 == links.max_train_s
    assert links.max_iters == DEFAULT.dense_replay_max_iters
    # everything the trajectory depends on is the shaped arm's
    same = ("seed", "model_hidden", "batch", "lr", "optimizer", "sites", "ranks", "target_loss", "eval_every")
    assert all(getattr(links, f) == getattr(DEFAULT, f) for f in same)
    assert Demo.client_config("dense", links) == Demo.client_config("dense", DEFAULT)
    off = Demo(dataclasses.replace(DEFAULT, dense_replay_max_iters=0), tmp_path, progress=False)
    off.run = run  # type: ignore[method-assign]
    assert off.replay_dense(_dense(reached=False, budget_s=60.0)) is None


def test_unshaped_run_files_have_no_emulated_link(tmp_path: Path) -> None:
    cfg = dataclasses.replace(DEFAULT, shaping=False, fluctuating=False)
    files = write_run_files(
        cfg,
        job="j",
        run_dir=tmp_path,
        sock_dir=tmp_path / "socks",
        secret_file=write_secret(tmp_path / "s"),
        trace_file=None,
    )
    for f in files:
        gw = load_gateway_config(f.config)
        assert not gw.shaping  # no rate, delay or trace on any link
        assert gw.link_rate_bps == UNSHAPED_RATE_BPS > DEFAULT.bandwidth_bps
