"""Gateway children: readiness from the ready file, a failed start reported with its log, clean reaping.

The daemon itself is tested in tests/gateways; here a few lines of Python stand in for it, speaking the
same command-line contract (``--config``, ``--ready-file``, ``--stats-file``, SIGTERM → stats file).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from wanrt.demo.config import DemoConfig
from wanrt.demo.failures import DemoFailed
from wanrt.demo.sites.config_files import SiteFiles, write_run_files, write_secret
from wanrt.demo.sites.gateway_processes import read_stats, start_gateways, stop_gateways, wait_ready

STAND_IN = r"""
import argparse, json, os, signal, sys
ap = argparse.ArgumentParser()
ap.add_argument("--config"); ap.add_argument("--ready-file"); ap.add_argument("--stats-file")
a = ap.parse_args()
site = os.path.basename(a.config)[3:-5]
if site == os.environ.get("FAIL_SITE"):
    print(f"gateway {site}: error: invalid value for 'gateway.rates.alpha'", flush=True)
    sys.exit(2)
got = []
signal.signal(signal.SIGTERM, lambda *_: got.append(1))
tmp = a.ready_file + ".tmp"
with open(tmp, "w") as fh:
    json.dump({"pid": os.getpid(), "site": site}, fh)
os.replace(tmp, a.ready_file)
while not got:
    signal.pause()
with open(a.stats_file, "w") as fh:
    json.dump({"site": site, "bytes_sent": 10, "bytes_received": 10, "per_peer": {}}, fh)
"""


@pytest.fixture
def files(tmp_path: Path) -> list[SiteFiles]:
    return write_run_files(
        DemoConfig(sites=3),
        job="j",
        run_dir=tmp_path,
        sock_dir=tmp_path / "s",
        secret_file=write_secret(tmp_path / "k"),
        trace_file=None,
    )


def command(tmp_path: Path) -> tuple[str, ...]:
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    return (sys.executable, str(script))


def test_ready_files_then_sigterm_yields_stats_and_reaped_processes(
    tmp_path: Path, files: list[SiteFiles]
) -> None:
    gws = start_gateways(files, command=command(tmp_path))
    try:
        wait_ready(gws, timeout_s=60)
        assert {g.ready["site"] for g in gws if g.ready} == {"a", "b", "c"}
    finally:
        codes = stop_gateways(gws)
    assert codes == {"a": 0, "b": 0, "c": 0}
    assert all(g.proc.returncode == 0 for g in gws)
    assert [read_stats(g)["bytes_sent"] for g in gws] == [10, 10, 10]


def test_a_gateway_that_dies_at_start_is_named_with_its_log(
    tmp_path: Path, files: list[SiteFiles], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAIL_SITE", "b")
    gws = start_gateways(files, command=command(tmp_path))
    try:
        with pytest.raises(DemoFailed) as info:
            wait_ready(gws, timeout_s=60)
    finally:
        stop_gateways(gws)
    text = str(info.value)
    assert info.value.fields["child"] == "gateway b"
    assert "exited before it was ready (exited with code 2)" in text
    assert "gateway.rates.alpha" in text  # the tail of its log
    assert all(g.proc.returncode is not None for g in gws)


def test_a_gateway_that_writes_no_stats_is_reported(tmp_path: Path, files: list[SiteFiles]) -> None:
    gws = start_gateways(files[:1], command=command(tmp_path))
    try:
        wait_ready(gws, timeout_s=60)
        files[0].stats.unlink(missing_ok=True)
    finally:
        stop_gateways(gws)
    files[0].stats.unlink()
    with pytest.raises(DemoFailed, match="wrote no stats file"):
        read_stats(gws[0])
