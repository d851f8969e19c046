"""`wanrt job init`: files the daemons' own loaders accept, private secrets, clear errors."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from gateways.config import load_gateway_config
from scheduler.daemon_config import load_scheduler_config
from wanrt.cli import main
from wanrt.errors import ConfigError
from wanrt.job.files import write_job


def test_a_job_the_daemons_accept(tmp_path: Path) -> None:
    files = write_job(tmp_path / "j", job="run-1", sites=["b", "a", "c"], base_port=7900)
    assert sorted(files.gateways) == ["a", "b", "c"]
    a = load_gateway_config(files.gateways["a"])
    assert set(a.peers) == {"b", "c"} and a.scheduler == "tcp://127.0.0.1:7903"
    assert a.secret_bytes() == load_gateway_config(files.gateways["c"]).secret_bytes()
    assert files.scheduler is not None and load_scheduler_config(files.scheduler).sites == ("a", "b", "c")
    for secret in (files.secret, files.control_token):
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600


def test_bad_settings_name_their_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        write_job(tmp_path, job="bad name", sites=["a"])
    assert exc.value.fields.get("key") == "job"
    with pytest.raises(ConfigError):
        write_job(tmp_path, job="j", sites=["a", "a"])


def test_cli_writes_and_prints_the_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["job", "init", "--sites", "a,b", "--dir", str(tmp_path / "j"), "--no-scheduler"]) == 0
    out = capsys.readouterr().out
    assert "wanrt gateway --config" in out and "wanrt scheduler" not in out
    assert not (tmp_path / "j" / "job.toml").exists()
