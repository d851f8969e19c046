"""``wanrt demo --straggler SITE:INTENSITY[:persistent]``: parsing, errors naming the flag, the slowdown a
trainer applies, the straggler tables the mitigating scheduler gets, and the comparison table."""

from __future__ import annotations

import argparse
import dataclasses
import tomllib
from pathlib import Path

import pytest

from scheduler.daemon_config import load_scheduler_config
from wanrt.demo.cli import add_arguments
from wanrt.demo.config import DEFAULT, QUICK, config_from_args
from wanrt.demo.results import CurvePoint, DecisionPoint, RunResult
from wanrt.demo.runner import ALL_MODES, Demo
from wanrt.demo.sites.config_files import write_scheduler_files
from wanrt.demo.straggler import Slowdown, StragglerSpec, parse_straggler
from wanrt.demo.straggler_results import StragglerComparison, format_straggler_table
from wanrt.errors import ConfigError


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


def test_the_flag_parses_into_the_config() -> None:
    assert config_from_args(parse()).straggler is None
    cfg = config_from_args(parse("--straggler", "c:0.8:persistent"))
    assert cfg.straggler == StragglerSpec("c", 0.8, persistent=True)
    assert str(cfg.straggler) == "c:0.8:persistent"
    quick = config_from_args(parse("--quick", "--straggler", "b:0.3"))
    assert quick.straggler == StragglerSpec("b", 0.3, persistent=False)
    assert dataclasses.replace(quick, straggler=None) == QUICK


@pytest.mark.parametrize(
    "argv",
    [
        ("--straggler", "c"),  # no intensity
        ("--straggler", "c:fast"),
        ("--straggler", "c:0"),  # AntDT's intensity is > 0
        ("--straggler", "c:11"),
        ("--straggler", "c:0.5:sometimes"),
        ("--straggler", ":0.5"),
        ("--quick", "--straggler", "c:0.5"),  # --quick has sites a and b only
        ("--sites", "2", "--straggler", "c:0.5"),
    ],
)
def test_a_bad_straggler_names_the_flag(argv: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_args(parse(*argv))
    assert err.value.fields["key"] == "--straggler"


def test_parse_straggler_checks_the_site_when_told_the_sites() -> None:
    assert parse_straggler(" a:1 ", ("a", "b")) == StragglerSpec("a", 1.0)
    with pytest.raises(ConfigError):
        parse_straggler("z:1", ("a", "b"))


def test_the_slowdown_is_antdts_delay_per_sample_and_half_the_period_when_transient() -> None:
    spec = StragglerSpec("c", 0.8, persistent=True)
    s = Slowdown.of(spec, sleep_s=0.25, batch=32, period_s=10.0)
    assert s.delay_s(32, 0.0) == pytest.approx(0.25 * 0.8)  # SleepDuration × Intensity at the batch
    assert s.delay_s(8, 99.0) == pytest.approx(0.25 * 0.8 / 4)  # fewer samples: less delay
    t = Slowdown.of(StragglerSpec("c", 0.5), sleep_s=0.2, batch=32, period_s=10.0)
    assert [t.active(x) for x in (0.0, 4.9, 5.0, 9.9, 10.0, 14.9, 15.1)] == [
        True,
        True,
        False,
        False,
        True,
        True,
        False,
    ]
    assert t.delay_s(32, 7.0) == 0.0


def test_the_mitigated_mode_writes_a_stragglers_scheduler_config(tmp_path: Path) -> None:
    assert "mitigated" in ALL_MODES
    cfg = dataclasses.replace(DEFAULT, straggler=StragglerSpec("c", 0.8, persistent=True))
    secret = tmp_path / "job.secret"
    secret.write_text("s" * 40)
    files = write_scheduler_files(
        cfg,
        job="wanrt-demo-mitigated",
        run_dir=tmp_path / "run",
        sock_dir=tmp_path / "s",
        secret_file=secret,
        policy="stragglers",
        stragglers=Demo.straggler_tables(cfg),
    )
    with files.config.open("rb") as fh:
        raw = tomllib.load(fh)
    assert raw["scheduler"]["policy"] == "stragglers"
    loaded = load_scheduler_config(files.config)
    d = loaded.stragglers.detection
    assert (d.short_s, d.long_s, d.slowness) == (
        cfg.straggler_short_s,
        cfg.straggler_long_s,
        cfg.straggler_slowness,
    )
    assert loaded.stragglers.batch.min_batch == cfg.batch // 8


def _run(
    mode: str, tta: float | None, its: int | None, decisions: tuple[DecisionPoint, ...] = ()
) -> RunResult:
    return RunResult(
        mode=mode,
        iterations=100,
        target_loss=0.3,
        tta_s=tta,
        iters_to_target=its,
        train_s=20.0 if mode == "wanrt" else 8.0,
        final_loss=0.29,
        final_accuracy=0.9,
        curve=(CurvePoint(0.0, 0, 2.3, 0.1),),
        step_times=(),
        wan_bytes_sent=0,
        wan_bytes_received=0,
        bytes_sent_per_site={},
        rounds_completed={},
        distinct_final_models=1,
        settings={"batch": 64},
        final_batch={"a": 64, "b": 64} if mode == "wanrt" else {"a": 120, "b": 8},
        decisions=decisions,
    )


def test_the_comparison_table_and_json() -> None:
    commit = DecisionPoint(3.0, "commit", 1, 20, {"batch_size@a": 120, "batch_size@b": 8}, None)
    c = StragglerComparison(
        "b:0.8:persistent", _run("wanrt", 20.0, 90), _run("mitigated", 8.0, 100, (commit,))
    )
    assert c.tta_gain == pytest.approx(2.5)
    assert c.iters_ratio == pytest.approx(100 / 90)
    assert c.first_adjust_s() == 3.0
    text = format_straggler_table(c)
    assert "2.50× faster" in text and "a 120 b 8" in text and "1 committed" in text
    data = c.to_json()
    assert data["straggler_tta_gain"] == pytest.approx(2.5) and data["first_adjust_s"] == 3.0
    missed = StragglerComparison("b:0.8", _run("wanrt", None, None), _run("mitigated", 8.0, 100))
    assert missed.tta_gain is None and "could not be compared" in format_straggler_table(missed)
