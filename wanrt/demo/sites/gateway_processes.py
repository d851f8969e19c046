"""The real gateway daemons of one demo run, as child processes: start, wait until ready, stop, read stats.

Each is ``python -m wanrt gateway --config gw-X.toml --ready-file ... --stats-file ...`` with its output in
``gw-X.log``. Readiness is the daemon's own signal: it writes the ready file atomically once all its
listeners are up. While waiting, an exit of the process is noticed at once through a pidfd (Linux ≥ 5.3),
so a gateway that fails to start is reported with its log instead of a timeout. Stopping is SIGTERM (the
daemon shuts down in phases and writes its stats file), then SIGKILL after a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, Final

from wanrt.demo.failures import DemoFailed
from wanrt.demo.sites.config_files import SiteFiles

__all__ = ["DaemonProcess", "GatewayProcess", "start_gateways", "stop_daemon", "stop_gateways", "wait_ready"]

#: how a gateway daemon is started (``python -m wanrt gateway``); the config/ready/stats flags are appended
GATEWAY_COMMAND: Final = (sys.executable, "-m", "wanrt", "gateway")
#: the daemon's own shutdown deadline is 10 s by default; beyond this plus a margin it is killed
STOP_TIMEOUT_S: Final = 20.0
#: an interval at which to look at ready files; process exits wake the wait earlier through the pidfd
READY_POLL_S: Final = 0.05


def _pidfd(pid: int) -> int | None:
    open_fn = getattr(os, "pidfd_open", None)
    if open_fn is None:
        return None
    try:
        return int(open_fn(pid))
    except OSError:
        return None


class DaemonProcess:
    """One daemon child (a gateway, the scheduler): its ``Popen``, its ready file and log, and a pidfd
    that becomes readable on exit."""

    def __init__(self, name: str, proc: subprocess.Popen[bytes], *, ready: Path, log: Path) -> None:
        self.name = name
        self.proc = proc
        self.ready_path = ready
        self.log = log
        self.pidfd = _pidfd(proc.pid)
        self.ready: dict[str, Any] | None = None
        #: time.monotonic() when the parent first saw the ready file
        self.ready_seen: float | None = None

    def failed(self, what: str) -> DemoFailed:
        code = self.proc.poll()
        status = "is running" if code is None else f"exited with code {code}"
        return DemoFailed(f"{self.name} {what} ({status})", child=self.name, log=self.log)

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise self.failed("stopped during the run")

    def read_ready(self) -> bool:
        """True once the daemon's ready file exists and holds JSON (it is written atomically)."""
        if self.ready is not None:
            return True
        try:
            self.ready = json.loads(self.ready_path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return False
        self.ready_seen = time.monotonic()
        return True

    def ready_written(self) -> float | None:
        """When the daemon wrote its ready file, on this host's monotonic clock (from the file's mtime):
        the daemon's own start-up instant, give or take its last start-up step."""
        try:
            mtime = self.ready_path.stat().st_mtime
        except FileNotFoundError:
            return None
        return time.monotonic() - (time.time() - mtime)

    def close_fd(self) -> None:
        if self.pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
            self.pidfd = None


class GatewayProcess(DaemonProcess):
    """One gateway daemon child and its files."""

    def __init__(self, files: SiteFiles, proc: subprocess.Popen[bytes]) -> None:
        super().__init__(f"gateway {files.site}", proc, ready=files.ready, log=files.log)
        self.files = files


def start_gateways(
    files: Sequence[SiteFiles],
    *,
    command: Sequence[str] = GATEWAY_COMMAND,
    env: Mapping[str, str] | None = None,
) -> list[GatewayProcess]:
    """Start one daemon per site. The caller owns the result and must :func:`stop_gateways` it."""
    child_env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
    out: list[GatewayProcess] = []
    try:
        for f in files:
            for stale in (f.ready, f.stats):
                stale.unlink(missing_ok=True)
            cmd = [
                *command,
                "--config",
                str(f.config),
                "--ready-file",
                str(f.ready),
                "--stats-file",
                str(f.stats),
            ]
            with f.log.open("wb") as log:
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env)
            out.append(GatewayProcess(f, proc))
    except BaseException:
        stop_gateways(out)
        raise
    return out


def wait_ready(gateways: Sequence[DaemonProcess], *, timeout_s: float) -> None:
    """Block until every daemon wrote its ready file; a daemon that exits first fails the run."""
    deadline = time.monotonic() + timeout_s
    while True:
        pending = [g for g in gateways if not g.read_ready()]
        if not pending:
            return
        for g in pending:
            if g.proc.poll() is not None:
                raise g.failed("exited before it was ready")
        if time.monotonic() > deadline:
            raise pending[0].failed(f"did not write its ready file within {timeout_s:.0f} s")
        fds = [g.pidfd for g in pending if g.pidfd is not None]
        wait(fds, timeout=READY_POLL_S)  # wakes at once if one of them exits


def _wait_exit(proc: subprocess.Popen[bytes], deadline: float) -> int | None:
    with contextlib.suppress(subprocess.TimeoutExpired):
        return proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    return None


def _terminate(g: DaemonProcess) -> None:
    if g.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            g.proc.send_signal(signal.SIGTERM)


def _reap(g: DaemonProcess, deadline: float) -> int:
    code = _wait_exit(g.proc, deadline)
    if code is None:
        with contextlib.suppress(ProcessLookupError):
            g.proc.kill()
        code = g.proc.wait()
    g.close_fd()
    return code


def stop_gateways(
    gateways: Sequence[GatewayProcess], *, one_by_one: bool = False, timeout_s: float = STOP_TIMEOUT_S
) -> dict[str, int]:
    """SIGTERM the running gateways, wait for them, SIGKILL stragglers; always reaps every process.

    At the end of a run they leave ``one_by_one``, as sites leave a real job: each says goodbye to peers
    that are still up, and each later one finds its links to the departed already ended. (Signalled at
    the same instant, two gateways can meet each other's goodbye mid-shutdown; the daemon must survive
    that too, but the demo's numbers should not depend on it.) On failure or Ctrl-C all are signalled at
    once: speed matters more than a tidy goodbye. Returns each site's exit code (``-9`` if killed).
    """
    deadline = time.monotonic() + timeout_s
    codes: dict[str, int] = {}
    if one_by_one:
        for g in gateways:
            _terminate(g)
            codes[g.files.site] = _reap(g, deadline)
        return codes
    for g in gateways:
        _terminate(g)
    for g in gateways:
        codes[g.files.site] = _reap(g, deadline)
    return codes


def stop_daemon(d: DaemonProcess, *, timeout_s: float = STOP_TIMEOUT_S) -> int:
    """SIGTERM one daemon, SIGKILL it after ``timeout_s``; returns its exit code (``-9`` if killed)."""
    _terminate(d)
    return _reap(d, time.monotonic() + timeout_s)


def read_stats(g: GatewayProcess) -> dict[str, Any]:
    """The stats the daemon wrote on shutdown; a missing or broken file fails with the gateway's log."""
    try:
        data = json.loads(g.files.stats.read_text())
    except FileNotFoundError:
        raise g.failed(f"wrote no stats file ({g.files.stats})") from None
    except json.JSONDecodeError as exc:
        raise g.failed(f"wrote an unreadable stats file ({exc})") from None
    if not isinstance(data, dict):
        raise g.failed("wrote a stats file that is not a JSON object")
    return data
