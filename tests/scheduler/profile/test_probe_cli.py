"""The real probe (tiny: a 16-wide MLP, a few hundred samples) and the ``wanrt profile`` command."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from scheduler.profile.probe_settings import ProbeSettings
from scheduler.profile.surrogate import ConvergenceProfile
from wanrt.cli import main
from wanrt.demo.digits_probe import DigitsProbe
from wanrt.errors import ConfigError

TINY = ProbeSettings(hidden=16, samples=400, lr=0.1, seed=0)


@pytest.fixture(scope="module")
def probe() -> DigitsProbe:
    return DigitsProbe(TINY)


def test_probe_is_deterministic_and_learns(probe: DigitsProbe) -> None:
    a = probe.loss(0.0, 16, 0)
    assert a == probe.loss(0.0, 16, 0)
    assert math.isfinite(a) and a < math.log(10)  # below chance after 25 steps


def test_staleness_and_compression_change_the_run(probe: DigitsProbe) -> None:
    fresh = probe.loss(0.0, 16, 0)
    stale = probe.loss(0.0, 16, 1)
    compressed = probe.loss(0.99, 16, 1)
    assert stale != fresh
    assert compressed != stale
    # at 1 % density with error feedback, 25 steps move the model far less than dense steps do
    assert compressed > stale
    assert DigitsProbe.relative(compressed, fresh) == pytest.approx(compressed / fresh - 1)


def test_a_larger_batch_takes_fewer_steps_for_the_same_samples(probe: DigitsProbe) -> None:
    assert probe.loss(0.0, 200, 0) > probe.loss(0.0, 8, 0)


@pytest.mark.parametrize(
    ("r", "x", "s", "key"), [(1.0, 8, 0, "r"), (0.5, 0, 0, "total_batch"), (0.5, 8, 2, "staleness")]
)
def test_probe_rejects_bad_arguments(probe: DigitsProbe, r: float, x: int, s: int, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        probe.loss(r, x, s)
    assert info.value.fields["key"] == key


def test_cli_help_lists_the_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["profile", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--out", "--probes", "--quick", "--config"):
        assert flag in out


def test_cli_writes_a_loadable_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "job.toml"
    cfg.write_text(
        "[profile]\ninit_probes = 2\nmax_total_batch = 64\ngp_restarts = 0\n"
        "[profile.probe]\nhidden = 16\nsamples = 200\n"
    )
    out = tmp_path / "profile.json"
    code = main(["profile", "--out", str(out), "--probes", "4", "--config", str(cfg), "--no-progress"])
    assert code == 0
    assert "4 probes" in capsys.readouterr().out
    prof = ConvergenceProfile.load(out)
    assert prof.r.size == 4 and prof.batch_range == (8.0, 64.0)
    assert json.loads(out.read_text())["probe"]["hidden"] == 16


def test_cli_reports_bad_flags_with_their_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "--out", str(tmp_path / "p.json"), "--probes", "0", "--no-progress"]) == 1
    assert "--probes" in capsys.readouterr().err
    assert main(["profile", "--out", str(tmp_path / "nodir" / "p.json"), "--no-progress"]) == 1
    assert "--out" in capsys.readouterr().err


def test_samples_to_target_counts_samples_until_the_target_and_extrapolates_past_the_cap() -> None:
    easy = dataclasses.replace(
        TINY, samples=3200, lr=0.3, measure="samples_to_target", target_loss=1.5, eval_every=1
    )
    probe = DigitsProbe(easy)
    reached = round(probe.loss(0.0, 16, 0) * 1000)
    assert 0 < reached < easy.samples and reached % 16 == 0
    hard = DigitsProbe(dataclasses.replace(easy, target_loss=1e-4), probe.data)
    assert hard.loss(0.0, 16, 0) * 1000 > hard.settings.samples  # not reached: beyond the cap


def test_probe_settings_reject_an_unknown_measure() -> None:
    with pytest.raises(ConfigError) as info:
        dataclasses.replace(TINY, measure="accuracy")
    assert info.value.fields["key"] == "measure"
