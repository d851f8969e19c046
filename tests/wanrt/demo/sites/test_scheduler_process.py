"""The scheduler child: the real ``wanrt scheduler`` starts from the config the demo writes, says it is
ready, writes its decisions file and stops cleanly on SIGTERM; a torn decisions file still reads."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from wanrt.demo.config import DemoConfig
from wanrt.demo.sites.config_files import write_scheduler_files, write_secret
from wanrt.demo.sites.gateway_processes import stop_daemon, wait_ready
from wanrt.demo.sites.scheduler_process import read_decisions, start_scheduler


def test_the_real_scheduler_starts_from_the_demo_config_and_stops_cleanly(tmp_path: Path) -> None:
    socks = Path(tempfile.mkdtemp(prefix="wanrt-t-", dir="/tmp"))
    try:
        files = write_scheduler_files(
            DemoConfig(sites=2, decide_interval_s=0.05),
            job="j",
            run_dir=tmp_path,
            sock_dir=socks,
            secret_file=write_secret(tmp_path / "job.secret"),
        )
        proc = start_scheduler(files)
        try:
            wait_ready([proc], timeout_s=60)
            assert proc.ready is not None and proc.ready["job"] == "j"
            assert proc.ready["listen"] == files.listen_url
            written = proc.ready_written()
            assert written is not None and proc.ready_seen is not None and written <= proc.ready_seen + 0.01
        finally:
            code = stop_daemon(proc)
        assert code == 0, files.log.read_text()
        # no gateway ever connected: at most decide ticks, with nothing decided and no estimate
        assert files.decisions.exists()
        for rec in read_decisions(files.decisions):
            assert rec["kind"] == "tick" and rec["decision"] is None and rec["bandwidth_estimate_bps"] is None
    finally:
        shutil.rmtree(socks, ignore_errors=True)


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    good = {"kind": "commit", "decision": 1, "values": {"density": 0.1}}
    path.write_text(json.dumps(good) + "\n" + '{"kind": "ti')
    assert read_decisions(path) == [good]
    assert read_decisions(tmp_path / "missing.jsonl") == []
