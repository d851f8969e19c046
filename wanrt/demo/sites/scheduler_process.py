"""The job's real scheduler daemon in a demo run with the scheduler: start it, read what it decided.

``python -m wanrt scheduler --config scheduler.toml --ready-file ... --decisions-file ...`` with its output
in ``scheduler.log``; readiness, supervision and stopping are the gateways' (:class:`DaemonProcess`). It is
started before the gateways, so each gateway's first dial finds it, and stopped after them, so no gateway
sees it leave while the run's last rounds finish (the job would train on without it anyway).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from wanrt.demo.sites.config_files import SchedulerFiles
from wanrt.demo.sites.gateway_processes import DaemonProcess

__all__ = ["SCHEDULER_COMMAND", "read_decisions", "start_scheduler"]

#: how the scheduler daemon is started; the config/ready/decisions flags are appended
SCHEDULER_COMMAND: Final = (sys.executable, "-m", "wanrt", "scheduler")
#: a decisions file of a long run stays small (a line per decide tick); this bounds a runaway one
MAX_DECISION_LINES: Final = 1_000_000


def start_scheduler(
    files: SchedulerFiles,
    *,
    command: tuple[str, ...] = SCHEDULER_COMMAND,
    env: Mapping[str, str] | None = None,
) -> DaemonProcess:
    """Start the daemon. The caller owns the result and must stop it (:func:`stop_daemon`)."""
    for stale in (files.ready, files.decisions):
        stale.unlink(missing_ok=True)
    cmd = [
        *command,
        "--config",
        str(files.config),
        "--ready-file",
        str(files.ready),
        "--decisions-file",
        str(files.decisions),
    ]
    child_env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
    with files.log.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env)
    return DaemonProcess("scheduler", proc, ready=files.ready, log=files.log)


def read_decisions(path: Path) -> list[dict[str, Any]]:
    """The decisions file's records in order; a torn last line (a killed daemon) is skipped."""
    out: list[dict[str, Any]] = []
    try:
        with path.open(encoding="utf-8") as fh:
            for n, line in enumerate(fh):
                if n >= MAX_DECISION_LINES:
                    break
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(rec, dict):
                    out.append(rec)
    except FileNotFoundError:
        return []
    return out
