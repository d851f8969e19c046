"""A wanrt job as a user runs it, as processes: ``wanrt job init``'s files, one ``wanrt gateway`` per site
(optionally the scheduler), and one trainer process per site (:mod:`tools.real_trainer`, the public client).

Why processes and not in-process daemons: what issue 21 asks about is what a user sees when *processes*
die — a ``kill -9`` of a trainer, a gateway's SIGTERM or SIGKILL — and the same command launched again.
The chaos soak's ``--real-clients`` mode and tests/tools/test_real_job.py drive jobs through this class.
Every process runs this worktree's code (``PYTHONPATH``), one rank per site (its own gloo group).
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wanrt.job.files import write_job

__all__ = ["RealJob", "free_base_port"]

REPO = Path(__file__).resolve().parent.parent


#: where :func:`free_base_port` looks: below Linux's default ephemeral range (32768-60999), so an outgoing
#: connection elsewhere on the host cannot take a port between the check here and the daemon's bind
PORT_RANGE = (20000, 32000)


def free_base_port(n: int) -> int:
    """A port p such that p .. p+n-1 are free now (the job's gateways and scheduler listen there)."""
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(200):
        base = rng.randrange(PORT_RANGE[0], PORT_RANGE[1] - n)
        socks = []
        try:
            for i in range(n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free range of ports found")


@dataclass
class RealJob:
    """One job's files under ``root`` and its processes (``close()`` ends every one still running)."""

    root: Path
    sites: tuple[str, ...] = ("a", "b")
    scheduler: bool = False
    #: run each gateway as tools.chaos_real_gateway (the daemon plus a rounds log per site) instead of
    #: ``wanrt gateway``
    rounds_logs: bool = False
    #: the trainer module each site runs (tools.outer_trainer: the same job with wanrt.DiLoCo)
    trainer_module: str = "tools.real_trainer"
    #: more ``[gateway.rounds]`` keys for every gateway (e.g. re-coded results: ``result_coding = "wire"``)
    rounds: dict[str, Any] = field(default_factory=dict)
    job: str = field(default_factory=lambda: f"rj{os.getpid()}x{random.randrange(1 << 20)}")
    gateways: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    trainers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _sched: subprocess.Popen[bytes] | None = None
    _launches: int = 0

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        # write_job's ports: the gateways' links, the scheduler, its metrics and each site's metrics
        self.base_port = free_base_port(2 * len(self.sites) + 2)
        self.files = write_job(
            self.root / "job",
            job=self.job,
            sites=list(self.sites),
            base_port=self.base_port,
            with_scheduler=self.scheduler,
            rounds=self.rounds,
        )
        self.env = dict(
            os.environ,
            PYTHONPATH=str(REPO),
            OMP_NUM_THREADS="1",
            # the NumPy reference kernels: JIT-compiling the fused path in every process would dominate
            # a short job (the kernels' own tests check every path against the reference)
            WANRT_KERNELS="numpy",
        )

    # -- daemons -----------------------------------------------------------------------------------------

    def _log(self, name: str) -> Any:
        return (self.root / f"{name}.log").open("ab")

    def start_scheduler(self) -> None:
        cmd = [sys.executable, "-m", "wanrt", "scheduler", "--config", str(self.root / "job" / "job.toml")]
        self._sched = subprocess.Popen(
            cmd, cwd=self.root, env=self.env, stdout=self._log("scheduler"), stderr=subprocess.STDOUT
        )

    def start_gateway(self, site: str, *extra: str, wait_s: float = 30.0) -> None:
        ready = self.root / f"gw-{site}.ready"
        ready.unlink(missing_ok=True)
        entry = ["tools.chaos_real_gateway"] if self.rounds_logs else ["wanrt", "gateway"]
        cmd = [
            sys.executable, "-m", *entry, "--config", str(self.root / "job" / f"gw-{site}.toml"),
            "--ready-file", str(ready), *extra,
        ]  # fmt: skip
        if self.rounds_logs:
            cmd += ["--rounds-log", str(self.root / f"rounds-{site}.jsonl")]
        self.gateways[site] = subprocess.Popen(
            cmd, cwd=self.root / "job", env=self.env, stdout=self._log(f"gw-{site}"), stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + wait_s
        while not ready.exists():
            if self.gateways[site].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"gateway {site} did not start: see {self.root / f'gw-{site}.log'}")
            time.sleep(0.05)

    def start_gateways(self, *extra: str) -> None:
        if self.scheduler and self._sched is None:
            self.start_scheduler()
        for site in self.sites:
            self.start_gateway(site, *extra)

    def stop_gateway(self, site: str, sig: int = signal.SIGTERM, wait_s: float = 30.0) -> None:
        proc = self.gateways.pop(site, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def gateway_log(self, site: str) -> str:
        return (self.root / f"gw-{site}.log").read_text(errors="replace")

    # -- trainers ----------------------------------------------------------------------------------------

    def trainer_command(self, site: str, *args: str) -> list[str]:
        return [
            sys.executable, "-m", self.trainer_module, "--site", site,
            "--gateway", self.files.trainer_urls[site], "--job", self.job,
            "--secret-file", str(self.files.trainer_secrets[site]),
            "--log", str(self.root / f"tr-{site}.jsonl"), "--out", str(self.root / f"out-{site}.json"), *args,
        ]  # fmt: skip

    def start_trainer(self, site: str, *args: str) -> subprocess.Popen[bytes]:
        """Launch (or launch again: the same command) site ``site``'s trainer, one rank of its own group."""
        self._launches += 1
        env = dict(
            self.env,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(free_base_port(1)),
            RANK="0",
            WORLD_SIZE="1",
        )
        (self.root / f"out-{site}.json").unlink(missing_ok=True)
        proc = subprocess.Popen(
            self.trainer_command(site, *args),
            cwd=REPO,
            env=env,
            stdout=self._log(f"tr-{site}"),
            stderr=subprocess.STDOUT,
        )
        self.trainers[site] = proc
        return proc

    def kill_trainer(self, site: str) -> float:
        """SIGKILL the site's trainer (a crash: no close(), no Bye); returns the time of the kill."""
        proc = self.trainers[site]
        proc.kill()
        t = time.time()
        proc.wait()
        return t

    def wait_trainers(self, timeout_s: float) -> dict[str, int | None]:
        deadline = time.monotonic() + timeout_s
        codes: dict[str, int | None] = {}
        for site, proc in self.trainers.items():
            try:
                codes[site] = proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[site] = None
        return codes

    def records(self, site: str) -> list[dict[str, Any]]:
        path = self.root / f"tr-{site}.jsonl"
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut short by a kill
        return out

    def wait_iteration(self, site: str, iteration: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            recs = self.records(site)
            if recs and recs[-1]["it"] >= iteration:
                return True
            if self.trainers[site].poll() is not None:
                return False
            time.sleep(0.05)
        return False

    def result(self, site: str) -> dict[str, Any] | None:
        path = self.root / f"out-{site}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def trainer_log(self, site: str) -> str:
        return (self.root / f"tr-{site}.log").read_text(errors="replace")

    def close(self) -> None:
        for proc in self.trainers.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for site in list(self.gateways):
            self.stop_gateway(site)
        if self._sched is not None and self._sched.poll() is None:
            self._sched.terminate()
            try:
                self._sched.wait(10)
            except subprocess.TimeoutExpired:
                self._sched.kill()
                self._sched.wait()

    def __enter__(self) -> RealJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
