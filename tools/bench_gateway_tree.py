"""Part (d) of ``tools/bench_gateway.py``: many ``wanrt gateway`` processes in a tree, on one machine.

Why subprocesses: peak memory per gateway is a property of a gateway *process* (interpreter, imports, one
connection per peer, queues), so it is read from ``/proc/PID/status`` (``VmHWM``, the peak resident set) of
real ``python -m wanrt gateway --config site.toml`` processes, each started from its own TOML file as an
operator would. Rounds per second are measured on the same processes: the benchmark process runs one
trainer per site (the real trainer protocol over each gateway's unix trainer socket) pushing one tiny layer
(one 16-float block) per iteration, each at most ``staleness = 1`` iteration ahead of the aggregates it
holds, so the number is the gateways' round-processing rate, not a link rate (links are unshaped unix
sockets). A "round" is one (iteration, layer) reduced over all sites and delivered to every site.

Every gateway of a job connects to every other (the daemon's design: any site may become a parent after a
re-plan), so N gateways hold N − 1 links each; the tree (arity 2, rooted at the first site) decides which
links carry data.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_gateway_cluster import JOB, SECRET, BenchTrainer, now, payload_of, short_dir

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class TreeSetup:
    gateways: int = 32
    seconds: float = 6.0  # measurement window
    warmup: int = 5  # iterations every site must have completed before the window opens
    staleness: int = 1
    arity: int = 2
    start_timeout_s: float = 300.0
    stop_timeout_s: float = 60.0  # SIGTERM -> exit, for all gateways together (then SIGKILL, reported)
    #: kernel paths to run the whole measurement with: "default" is what an operator gets (the codec's
    #: numba kernels, compiled or loaded at start-up), "numpy" sets WANRT_KERNELS=numpy (no numba/LLVM)
    kernels: tuple[str, ...] = ("default", "numpy")


def _toml(site: str, names: list[str], d: Path, setup: TreeSetup) -> str:
    peers = "\n".join(f'{p} = "unix://{d}/g{p}.sock"' for p in names if p != site)
    return f"""[gateway]
site = "{site}"
job = "{JOB}"
secret_file = "secret"
listen = "unix://{d}/g{site}.sock"
trainer_listen = "unix://{d}/t{site}.sock"
root = "{names[0]}"
reconnect_initial_s = 0.2
reconnect_max_s = 2.0
shutdown_deadline_s = 5.0

[gateway.peers]
{peers}

[gateway.rounds]
topology = "tree"
tree_arity = {setup.arity}
round_deadline_s = 60.0
t_w_s = 60.0
suspect_after_s = 120.0

[gateway.timeouts]
connect = 20.0
handshake = 30.0
heartbeat_interval = 5.0
heartbeat_misses = 6
close = 2.0
"""


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far, from /proc/PID/stat."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def _status_kb(pid: int, key: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


async def _wait_files(paths: list[Path], procs: list[subprocess.Popen[bytes]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"a gateway exited with {proc.returncode} before it was ready")
        if time.monotonic() > deadline:
            raise TimeoutError("gateways not ready in time")
        await asyncio.sleep(0.1)


def _completed(t: BenchTrainer) -> int:
    """Iterations 0..n-1 whose aggregate this trainer holds (one layer per iteration)."""
    n = 0
    while (n, 0) in t.arrived:
        n += 1
    return n


async def _train(t: BenchTrainer, staleness: int, stop: asyncio.Event) -> None:
    pay = payload_of(0, 64, 0.25)
    n = 0
    while not stop.is_set():
        need = n - 1 - staleness
        if need >= 0 and (need, 0) not in t.arrived:
            await t.wait_for([(need, 0)])
            continue
        await t.push(n, 0, pay)
        n += 1


async def run_tree(setup: TreeSetup) -> dict[str, Any]:
    """Every kernel variant in turn; the headline numbers are those of the first (the default)."""
    variants = {k: await run_variant(setup, k) for k in setup.kernels}
    first = variants[setup.kernels[0]]
    return {
        "gateways": setup.gateways,
        "variants": variants,
        "rounds_per_s": first["rounds_per_s"],
        "peak_rss_mb_max": first["peak_rss_mb_max"],
    }


async def run_variant(setup: TreeSetup, kernels: str) -> dict[str, Any]:
    names = [f"g{i:02d}" for i in range(setup.gateways)]
    procs: list[subprocess.Popen[bytes]] = []
    with short_dir() as d:
        (d / "secret").write_text(SECRET)
        env = dict(os.environ, PYTHONPATH=str(REPO))
        env.pop("WANRT_KERNELS", None)
        if kernels != "default":
            env["WANRT_KERNELS"] = kernels
        t_launch = now()
        for s in names:
            (d / f"{s}.toml").write_text(_toml(s, names, d, setup))
            with open(d / f"{s}.log", "wb") as log:
                procs.append(
                    subprocess.Popen(
                        [
                            *(sys.executable, "-m", "wanrt", "gateway", "--config", str(d / f"{s}.toml")),
                            *("--ready-file", str(d / f"{s}.ready"), "--log-level", "WARNING"),
                        ],
                        cwd=REPO,
                        env=env,
                        stdout=subprocess.DEVNULL,
                        stderr=log,
                    )
                )
        trainers: list[BenchTrainer] = []
        stop = asyncio.Event()
        loops: list[asyncio.Task[None]] = []
        try:
            await _wait_files([d / f"{s}.ready" for s in names], procs, setup.start_timeout_s)
            t_ready = now()
            for s in names:
                t = BenchTrainer(f"unix://{d}/t{s}.sock", s)
                await t.connect()
                trainers.append(t)
            loops = [
                asyncio.get_running_loop().create_task(_train(t, setup.staleness, stop)) for t in trainers
            ]
            async with asyncio.timeout(setup.start_timeout_s):
                while min(_completed(t) for t in trainers) < 1:
                    await asyncio.sleep(0.05)
                t_first = now()
                while min(_completed(t) for t in trainers) < setup.warmup:
                    await asyncio.sleep(0.01)
            c0, t0 = min(_completed(t) for t in trainers), now()
            cpu0 = [_cpu_s(p.pid) for p in procs], time.process_time()
            await asyncio.sleep(setup.seconds)
            c1, t1 = min(_completed(t) for t in trainers), now()
            cpu1 = [_cpu_s(p.pid) for p in procs], time.process_time()
            hwm = [_status_kb(p.pid, "VmHWM") for p in procs]
            rss = [_status_kb(p.pid, "VmRSS") for p in procs]
            errors = [e for t in trainers for e in t.errors]
        finally:
            stop.set()
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            for t in trainers:
                with contextlib.suppress(Exception):
                    await t.close()
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            exit_codes = []
            killed = []
            deadline = time.monotonic() + setup.stop_timeout_s  # one deadline for all: they stop in parallel
            for name, p in zip(names, procs, strict=True):
                try:
                    exit_codes.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
                except subprocess.TimeoutExpired:
                    p.kill()
                    exit_codes.append(p.wait())
                    killed.append(name)
        killed_logs = {
            name: (d / f"{name}.log").read_text(errors="replace").splitlines()[-5:] for name in killed
        }
        logs_tail = [
            line
            for s in names
            for line in (d / f"{s}.log").read_text(errors="replace").splitlines()
            if " ERROR " in line
        ][:5]
    peaks = [k / 1024 for k in hwm if k is not None]
    currents = [k / 1024 for k in rss if k is not None]
    return {
        "kernels": kernels,
        "gateways": setup.gateways,
        "topology": f"tree, arity {setup.arity}",
        "measured_on": "wanrt gateway subprocesses (rounds/s and RSS); trainers in the benchmark process",
        "links_per_gateway": setup.gateways - 1,
        "start_to_ready_s": t_ready - t_launch,
        "ready_to_first_round_s": t_first - t_ready,
        "window_s": t1 - t0,
        "rounds": c1 - c0,
        "rounds_per_s": (c1 - c0) / (t1 - t0),
        # where the time goes during the window: CPU cores busy in the gateways, and in this process
        # (the 32 trainers and the event loop that runs them)
        "gateways_cpu_cores": sum(b - a for a, b in zip(cpu0[0], cpu1[0], strict=True)) / (t1 - t0),
        "trainers_cpu_cores": (cpu1[1] - cpu0[1]) / (t1 - t0),
        "peak_rss_mb_max": max(peaks),
        "peak_rss_mb_mean": statistics.fmean(peaks),
        "rss_mb_mean_end": statistics.fmean(currents),
        "exit_codes": sorted(set(exit_codes)),
        "killed_after_stop_timeout": killed,
        "killed_logs": killed_logs,
        "trainer_errors": errors[:5],
        "gateway_errors": logs_tail,
    }


def print_tree(tree: dict[str, Any]) -> None:
    first = next(iter(tree["variants"].values()))
    print(
        f"\n(d) {tree['gateways']} `wanrt gateway` processes, {first['topology']}, unix sockets, "
        f"{first['links_per_gateway']} links each, 1 tiny layer per iteration, staleness 1"
    )
    print(
        f"  {'kernels':8} {'start s':>8} {'1st round s':>11} {'rounds':>7} {'rounds/s':>9} "
        f"{'peak RSS max MB':>15} {'mean MB':>8} {'exit':>5} {'CPU cores gw/trainers':>22}"
    )
    for t in tree["variants"].values():
        print(
            f"  {t['kernels']:8} {t['start_to_ready_s']:8.1f} {t['ready_to_first_round_s']:11.1f} "
            f"{t['rounds']:7d} {t['rounds_per_s']:9.1f} {t['peak_rss_mb_max']:15.1f} "
            f"{t['peak_rss_mb_mean']:8.1f} {','.join(map(str, t['exit_codes'])):>5} "
            f"{t['gateways_cpu_cores']:15.2f} / {t['trainers_cpu_cores']:4.2f}"
        )
        if t["trainer_errors"] or t["gateway_errors"]:
            print(f"  errors ({t['kernels']}): {t['trainer_errors']} {t['gateway_errors']}")
        if t["killed_after_stop_timeout"]:
            print(
                f"  not stopped {t['kernels']}: {t['killed_after_stop_timeout']} "
                "(SIGKILL after the stop timeout)"
            )
    print("  (start: launch of all processes -> every ready file; RSS = VmHWM of each gateway process)")
