"""`wanrt job init`: files the daemons' own loaders accept, private secrets, clear errors."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from gateways.config import load_gateway_config
from scheduler.daemon_config import load_scheduler_config
from wanrt.cli import main
from wanrt.client.bootstrap import read_secret
from wanrt.errors import ConfigError
from wanrt.job.files import write_job


def test_a_job_the_daemons_accept(tmp_path: Path) -> None:
    files = write_job(tmp_path / "j", job="run-1", sites=["b", "a", "c"], base_port=7900)
    assert sorted(files.gateways) == ["a", "b", "c"]
    a = load_gateway_config(files.gateways["a"])
    assert set(a.peers) == {"b", "c"} and a.scheduler == "tcp://127.0.0.1:7903"
    c = load_gateway_config(files.gateways["c"])
    ka, kc = a.credentials(), c.credentials()
    assert ka.for_peer("c") == kc.for_peer("a")  # the pair's key, held by both ends
    assert ka.for_peer("b") != kc.for_peer("b")  # c cannot prove a's pair key with b
    assert ka.for_trainer() not in (ka.for_peer("b"), ka.for_peer("c"), kc.for_trainer())
    assert read_secret(files.trainer_secrets["a"], site="a", job="run-1") == ka.for_trainer()
    assert files.scheduler is not None
    sched = load_scheduler_config(files.scheduler)
    assert sched.sites == ("a", "b", "c") and sched.credentials().for_site("a") == ka.for_scheduler()
    # every daemon serves /status on its own port, none taken by a link (issue 21: no hand edit needed)
    ports = [sched.metrics_port, *(load_gateway_config(p).metrics_port for p in files.gateways.values())]
    links = [7900, 7901, 7902, 7903]
    assert 0 not in ports and len(set(ports + links)) == len(ports + links)
    assert files.status_urls["a"] == f"http://127.0.0.1:{a.metrics_port}/status"
    assert files.status_urls["scheduler"] == f"http://127.0.0.1:{sched.metrics_port}/status"
    assert files.secret is None
    private = [files.control_token, *files.trainer_secrets.values(), files.directory / "job.master"]
    for path in private + list((files.directory / "keys").glob("*.json")):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_a_shared_secret_job(tmp_path: Path) -> None:
    files = write_job(tmp_path / "j", job="run-1", sites=["a", "b"], keys="shared")
    a, b = (load_gateway_config(files.gateways[s]) for s in "ab")
    assert files.secret is not None and a.secret_bytes() == b.secret_bytes()
    assert a.credentials().for_trainer() == a.credentials().for_peer("b")
    assert stat.S_IMODE(files.secret.stat().st_mode) == 0o600


def test_rotating_keys_changes_every_key(tmp_path: Path) -> None:
    files = write_job(tmp_path / "j", job="run-1", sites=["a", "b"], base_port=7950)
    before = load_gateway_config(files.gateways["a"]).credentials()
    args = ["job", "init", "--keys-only", "--sites", "a,b", "--dir", str(files.directory), "--job", "run-1"]
    assert main(args) == 0
    after = load_gateway_config(files.gateways["a"]).credentials()
    assert after.for_peer("b") != before.for_peer("b") and after.for_trainer() != before.for_trainer()


def test_a_keys_file_for_another_site_or_job_is_refused(tmp_path: Path) -> None:
    from wanrt.keys import load_keys_file

    files = write_job(tmp_path / "j", job="run-1", sites=["a", "b"], base_port=7960)
    keys_a = str(files.directory / "keys" / "a.json")
    with pytest.raises(ConfigError, match="for site 'a', not 'b'"):
        load_keys_file(keys_a, job="run-1", site="b")
    with pytest.raises(ConfigError, match="not 'other'"):
        load_keys_file(keys_a, job="other", site="a")
    (tmp_path / "bad.json").write_text(
        '{"format": "wanrt-keys-1", "job": "run-1", "site": "a", "trainer": "x"}'
    )
    with pytest.raises(ConfigError, match="64 hex"):
        load_keys_file(str(tmp_path / "bad.json"), job="run-1", site="a")


def test_bad_settings_name_their_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        write_job(tmp_path, job="bad name", sites=["a"])
    assert exc.value.fields.get("key") == "job"
    with pytest.raises(ConfigError):
        write_job(tmp_path, job="j", sites=["a", "a"])


def test_two_jobs_of_one_name_at_different_ports_do_not_share_a_trainer_socket(tmp_path: Path) -> None:
    first = write_job(tmp_path / "1", job="run-1", sites=["a", "b"], base_port=7700)
    second = write_job(tmp_path / "2", job="run-1", sites=["a", "b"], base_port=7800)
    assert first.trainer_urls["a"] == "unix:///tmp/wanrt-run-1-7700-a.sock"
    assert set(first.trainer_urls.values()).isdisjoint(second.trainer_urls.values())


def test_a_trainer_socket_path_too_long_for_unix_is_refused_before_any_daemon_starts(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="longer than a unix socket allows") as err:
        write_job(tmp_path, job="j" * 60, sites=["s" * 40])
    assert err.value.key == "sites"


def test_cli_writes_and_prints_the_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["job", "init", "--sites", "a,b", "--dir", str(tmp_path / "j"), "--no-scheduler"]) == 0
    out = capsys.readouterr().out
    assert "wanrt gateway --config" in out and "wanrt scheduler" not in out
    assert "/status" in out
    assert not (tmp_path / "j" / "job.toml").exists()


def test_another_sites_trainer_key_is_refused_naming_its_site(tmp_path: Path) -> None:
    """Issue 21: site b's key at site a's trainer said "wrong job secret" (from the gateway, late)."""
    files = write_job(tmp_path / "j", job="run-1", sites=["a", "b"], base_port=7970)
    with pytest.raises(ConfigError, match="this key belongs to site b, and this trainer is site a") as exc:
        read_secret(files.trainer_secrets["b"], site="a", job="run-1")
    assert exc.value.fields.get("key") == "secret_file"
    with pytest.raises(ConfigError, match="belongs to job 'run-1', not 'other'"):
        read_secret(files.trainer_secrets["a"], site="a", job="other")
    bare = tmp_path / "bare.key"  # a secret without the owner line: any site, as before
    bare.write_text("0123456789abcdef0123456789abcdef\n")
    assert read_secret(bare, site="a", job="run-1") == b"0123456789abcdef0123456789abcdef"
