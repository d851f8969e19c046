"""``wanrt demo --mode``: the flag's parsing and checks, the inner-step accounting of an outer loop whose H
the scheduler changed, the row per mode, and the ``[scheduler.mode]`` table the auto arm writes."""

from __future__ import annotations

import argparse
import dataclasses
import tomllib
from pathlib import Path

import pytest

from scheduler.daemon_config import load_scheduler_config
from tests.wanrt.demo.test_results import result
from wanrt.demo.cli import add_arguments
from wanrt.demo.config import DEFAULT, config_from_args
from wanrt.demo.mode_results import format_mode_table, inner_steps, mode_rows, modes_json
from wanrt.demo.results import DecisionPoint
from wanrt.demo.runner import Demo
from wanrt.demo.sites.config_files import write_scheduler_files
from wanrt.errors import ConfigError


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


def test_the_flag_lists_arms_in_order_and_leaves_the_default_alone() -> None:
    assert config_from_args(parse()).modes == ()
    cfg = config_from_args(parse("--mode", "diloco, per-step,auto", "--outer-steps", "8"))
    assert cfg.modes == ("diloco", "per-step", "auto") and cfg.outer_steps == 8
    assert dataclasses.replace(cfg, modes=(), outer_steps=DEFAULT.outer_steps) == DEFAULT


@pytest.mark.parametrize(
    ("argv", "key"),
    [
        (("--mode", "ring"), "--mode"),
        (("--mode", "diloco,diloco"), "--mode"),
        (("--mode", "streaming", "--outer-steps", "6"), "--outer-fragments"),  # 4 fragments do not divide 6
        (("--outer-fragments", "0"), "--outer-fragments"),
        (("--outer-steps", "0"), "--outer-steps"),
    ],
)
def test_a_bad_mode_flag_is_refused_by_name(argv: tuple[str, ...], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_args(parse(*argv))
    assert err.value.fields["key"] == key


def _commit(effective: int, h: int) -> DecisionPoint:
    return DecisionPoint(1.0, "commit", 1, effective, {"outer_steps": h}, 1e6)


def test_inner_steps_follow_the_h_in_force() -> None:
    r = result("auto", tta=10.0, its=12, train_s=10.0, sent=1000, loss=0.1)
    r = dataclasses.replace(r, decisions=(_commit(4, 8), _commit(10, 2)), settings={"outer_steps": 16})
    assert inner_steps(r, 3, 16) == 48
    assert inner_steps(r, 12, 16) == 4 * 16 + 6 * 8 + 2 * 2
    assert inner_steps(r, 12, 1) == 4 * 1 + 6 * 8 + 2 * 2


def test_a_row_per_mode_with_ratios_against_dense() -> None:
    dense = result("dense", tta=60.0, its=100, train_s=60.0, sent=3_000_000, loss=0.1)
    per_step = result("wanrt", tta=20.0, its=110, train_s=20.0, sent=300_000, loss=0.1)
    diloco = dataclasses.replace(
        result("diloco", tta=5.0, its=8, train_s=5.0, sent=10_000, loss=0.1), settings={"outer_steps": 16}
    )
    rows = mode_rows(dense, {"per-step": per_step, "diloco": diloco})
    assert [r.mode for r in rows] == ["dense", "per-step", "diloco"]
    assert rows[2].inner_steps_to_target == 128 and rows[1].inner_steps_to_target == 110
    table = format_mode_table(rows)
    assert "300x less" in table and "diloco" in table
    data = modes_json(rows, {})
    assert data["modes"]["diloco"]["bytes_to_target_vs_dense"] == pytest.approx(300.0)
    assert data["modes"]["diloco"]["tta_vs_dense"] == pytest.approx(12.0)


def test_the_auto_arms_scheduler_config_loads(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"x" * 32)
    cfg = dataclasses.replace(DEFAULT, modes=("auto",))
    files = write_scheduler_files(
        cfg,
        job="j",
        run_dir=tmp_path / "run",
        sock_dir=tmp_path / "s",
        secret_file=secret,
        mode=Demo.mode_table(cfg),
    )
    assert tomllib.loads(files.config.read_text())["scheduler"]["mode"]["codings"] == ["int2"]
    loaded = load_scheduler_config(files.config)
    assert loaded.mode.enabled and loaded.mode.codings == ("int2",)
    assert loaded.mode.outer_density["int2"] == cfg.outer_density
