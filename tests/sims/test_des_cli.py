"""``wanrt sim``: help, a tiny run writing JSON and PNGs, and errors as exit code 1 with the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wanrt.cli import main

TINY = """
[sim]
name = "tiny"
names = ["a", "b", "c"]
iterations = 3
sample_interval_s = 0.01
[sim.payload]
layers = 2
dense_len = 512
[sim.gateway.rounds]
topology = "tree"
"""


def test_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["sim", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "--json" in out and "--plots" in out and "scenario" in out


def test_tiny_run_writes_json_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "tiny.toml"
    scenario.write_text(TINY)
    out_json = tmp_path / "r.json"
    plots = tmp_path / "plots"
    assert main(["sim", str(scenario), "--json", str(out_json), "--plots", str(plots)]) == 0
    assert "round time" in capsys.readouterr().out
    data = json.loads(out_json.read_text())
    assert data["summary"]["finished"] is True
    assert data["summary"]["aggregates"] == 3 * 3 * 2
    assert set(data["frontier"]) == {"a", "b", "c"}
    for name in ("round_times.png", "links.png", "frontier.png"):
        png = (plots / name).read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 1000


def test_bad_scenario_is_an_error_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "bad.toml"
    scenario.write_text("[sim.network]\nloss = 2\n")
    assert main(["sim", str(scenario)]) == 1
    assert "sim.network.loss" in capsys.readouterr().err


def test_unknown_scenario_lists_the_packaged_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "no-such-scenario"]) == 1
    assert "four-sites" in capsys.readouterr().err
