"""``wanrt demo --ddp``: off by default; refused with the reason and the way to enable it where namespaces
are missing; end to end (root only, slow) the JSON carries the DDP run and the ratios against it."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

import wanrt.demo.netns_sites as netns_sites
from sims.netns import probe
from wanrt.demo.config import DEFAULT
from wanrt.demo.ddp_option import add_ddp_argument, ddp_setup
from wanrt.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_ddp_argument(p)
    return p.parse_args(list(argv))


def test_off_by_default_changes_nothing(tmp_path: Path) -> None:
    with ddp_setup(_args(), DEFAULT, tmp_path, say=lambda _: None) as setup:
        assert setup.cfg == DEFAULT and setup.net is None and setup.job is None


def test_without_namespaces_the_flag_is_refused_with_how_to_enable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(netns_sites, "netns_unavailable", lambda: "needs root")
    with pytest.raises(ConfigError) as err, ddp_setup(_args("--ddp"), DEFAULT, tmp_path, say=lambda _: None):
        pass
    assert err.value.fields["key"] == "--ddp"
    assert "needs root" in str(err.value) and "iproute2" in str(err.value)


@pytest.mark.slow
def test_quick_demo_with_ddp_reports_against_real_ddp(tmp_path: Path) -> None:
    reason = probe().skip_reason()
    if reason is not None:
        pytest.skip(reason)
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "wanrt", "demo", "--quick", "--ddp", "--no-scheduler", "--no-progress",
         "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    assert data["config"]["rtt_s"] == 0.0 and data["config"]["fluctuating"] is False
    assert data["ddp"]["mode"] == "ddp" and data["ddp"]["distinct_final_models"] == 1
    assert data["ddp"]["final_loss"] < 0.7 * data["ddp"]["curve"][0]["loss"]
    for key in ("tta_speedup_vs_ddp", "dense_tta_speedup_vs_ddp", "iters_to_target_ratio_vs_ddp"):
        assert key in data, key
    assert "headline: wanrt reached loss" in proc.stdout and "real DDP (gloo)" in proc.stdout


def test_ddp_and_straggler_together_are_refused_before_anything_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from wanrt.cli import main

    assert main(["demo", "--ddp", "--straggler", "c:0.8:persistent", "--quick"]) == 1
    assert "--ddp and --straggler" in capsys.readouterr().err
