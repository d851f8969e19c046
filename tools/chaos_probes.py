"""Probes of what users and attackers do to a job, against real daemons on loopback (issue 21, items 3, 5, 6).

A job written by ``wanrt job init`` (2 sites, per-site keys, a scheduler), its daemons started as
``wanrt scheduler`` / ``wanrt gateway`` processes, and trainers from ``tools/probe_trainer.py`` (the public
client with torch). What is measured, key by key:

* ``mistakes_failing_fast`` — ``"all"`` when each user mistake fails within :data:`FAST_S` at every site
  with its own message, else the list of those that did not: ``model_mismatch`` (site a trains first, site
  b starts with one extra layer: ``ModelMismatch`` at both, naming each other), ``another_sites_key``
  (site a's trainer given ``keys/b.trainer``: "this key belongs to site b" at ``wanrt.init``),
  ``forgotten_close`` (site b never calls ``ctx.close()``: ``UnclosedContextWarning`` at its exit naming
  the consequence), ``relative_paths`` (the demo's config writer and ``wanrt job init`` given relative
  paths, loaded from another working directory). ``mistakes`` holds each one's detail.
* ``forged_join_accepted`` — site a's gateway is down; a peer with a's valid keys claims frontier 999 987
  and ``join_at`` 10⁶ at site b: 1 if b keeps the link (or lists a live), else 0.
* ``preauth_flood_blocks_rejoin`` — 1 if site a's restarted gateway, while 8 hosts (127.0.0.2-9) hold 8
  unauthenticated connections each at site b (re-opened as fast as b closes them), takes more than 2× its
  quiet rejoin time (``rejoin_quiet_s``, ``rejoin_flood_s``) to link to b, else 0.
* ``closed_link_buffer_mb`` — a peer with a's keys announces a 256 MiB frame, sends 1 MiB of it and drops
  the link (a plain close), every 0.7 s, 6 times: site b's RSS one second after the last close, less its
  RSS before (``rss_idle_mb``); ``attack_peak_mb``: the most above it while the attack ran.

``run_probes(...)`` returns these keys (for the chaos soak's report); the command line prints a table and
writes ``--json PATH``. One run takes about a minute; there is no ``--quick``: every probe is already its
smallest form. The machine's load matters only for the rejoin times (both measured in the same run).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gateways.config import GatewayConfig, load_gateway_config  # noqa: E402
from tools.chaos_peer import MaliciousPeer, closed_within  # noqa: E402
from wanrt.payload import SparsePayload  # noqa: E402
from wanrt.protocol import Push  # noqa: E402
from wanrt.protocol.limits import MAX_FRAME_BYTES  # noqa: E402

__all__ = ["FAST_S", "run_probes"]

#: a mistake "fails fast" when every site has its message within this long (issue 21's done-when)
FAST_S = 5.0
#: unique per run: the job's trainer sockets are /tmp/wanrt-<job>-<base port>-<site>.sock (wanrt job init's
#: default), so two runs on one host (two test sessions, a CI run beside a developer's) must not share a job
#: name
JOB = f"probe-job-{os.getpid()}"
SITES = ("a", "b")
#: how long a daemon or a trainer may take before the probe gives up on it
START_S = 30.0
TRAINER_S = 60.0


def _free_base_port(count: int) -> int:
    """A base port with ``count`` free ports after it (checked by binding each)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        if base + count > 65000:
            continue
        try:
            for port in range(base, base + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError("no run of free ports found")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "WANRT_KERNELS": os.environ.get("WANRT_KERNELS", "numpy")}


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    raise RuntimeError(f"no VmRSS for pid {pid}")


class Job:
    """The job's files and daemon processes."""

    def __init__(self, work: Path) -> None:
        from wanrt.job.files import write_job

        self.work = work
        self.files = write_job(work / "job", job=JOB, sites=list(SITES), base_port=_free_base_port(8))
        self.configs: dict[str, GatewayConfig] = {
            s: load_gateway_config(p) for s, p in self.files.gateways.items()
        }
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ready: dict[str, dict[str, Any]] = {}
        self.starts: dict[str, int] = {}

    def start(self, name: str) -> None:
        """Start the scheduler (``name`` "scheduler") or a site's gateway; returns once it listens."""
        n = self.starts[name] = self.starts.get(name, 0) + 1
        ready = self.work / f"{name}.{n}.ready.json"
        if name == "scheduler":
            assert self.files.scheduler is not None
            cmd = ["scheduler", "--config", str(self.files.scheduler)]
        else:
            cmd = ["gateway", "--config", str(self.files.gateways[name])]
        log = (self.work / f"{name}.{n}.log").open("wb")
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "wanrt", *cmd, "--ready-file", str(ready)],
            env=_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.work,
        )
        deadline = time.monotonic() + START_S
        while not ready.exists():
            if self.procs[name].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start; see {log.name}")
            time.sleep(0.05)
        self.ready[name] = json.loads(ready.read_text())

    def stop(self, name: str, sig: int = signal.SIGTERM) -> None:
        proc = self.procs.pop(name, None)
        if proc is None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def fresh_gateways(self) -> None:
        """Both gateways restarted with no state: a new run may start (a run ended refuses another)."""
        for s in SITES:
            self.stop(s)
        for s in SITES:
            (self.files.directory / f"state-{s}.json").unlink(missing_ok=True)
        for s in reversed(SITES):
            self.start(s)
        self.wait(lambda: self.peer_state("b", "a") == "up", "the gateways to link")

    def status(self, site: str) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.ready[site]['metrics_url']}/status", timeout=5) as r:
            return dict(json.loads(r.read()))

    def peer_state(self, site: str, peer: str) -> str:
        try:
            return str(self.status(site)["peers"][peer]["state"])
        except (OSError, KeyError, ValueError):
            return "unknown"

    @staticmethod
    def wait(pred: Any, what: str, timeout: float = START_S) -> float:
        t0 = time.monotonic()
        while not pred():
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"timed out waiting for {what}")
            time.sleep(0.05)
        return time.monotonic() - t0

    def close(self) -> None:
        for name in list(self.procs):
            self.stop(name)


# -- mistakes ---------------------------------------------------------------------------------------------


def _trainer(
    job: Job, site: str, tag: str, *extra: str, key_site: str | None = None
) -> subprocess.Popen[bytes]:
    out = job.work / f"trainer-{tag}-{site}.json"
    log = (job.work / f"trainer-{tag}-{site}.log").open("wb")
    key = job.files.trainer_secrets[key_site or site]
    cmd = [sys.executable, str(ROOT / "tools" / "probe_trainer.py"), "--site", site, "--job", JOB]
    cmd += ["--gateway", job.files.trainer_urls[site], "--secret-file", str(key), "--out", str(out)]
    cmd += ["--update-timeout", "30", *extra]
    return subprocess.Popen(cmd, env=_env(), stdout=log, stderr=subprocess.STDOUT, cwd=job.work)


def _result(job: Job, site: str, tag: str, proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    try:
        proc.wait(TRAINER_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    out = job.work / f"trainer-{tag}-{site}.json"
    res: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {"ok": False, "error": "no result"}
    res["log"] = (job.work / f"trainer-{tag}-{site}.log").read_text(errors="replace")[-4000:]
    return res


def probe_another_sites_key(job: Job) -> dict[str, Any]:
    r = _result(job, "a", "key", _trainer(job, "a", "key", key_site="b"))
    ok = r.get("error") == "ConfigError" and "belongs to site b" in str(r.get("message"))
    return {"ok": ok and float(r.get("seconds", 1e9)) <= FAST_S, "a": _brief(r)}


def probe_forgotten_close(job: Job) -> dict[str, Any]:
    # a is the slower site, so b (which forgets close) exits first: its last pushes must still reach a
    a = _trainer(job, "a", "close", "--steps", "8", "--step-delay", "0.3")
    b = _trainer(job, "b", "close", "--steps", "8", "--no-close")
    ra, rb = _result(job, "a", "close", a), _result(job, "b", "close", b)
    warned = "UnclosedContextWarning" in rb["log"] and "without ctx.close()" in rb["log"]
    return {
        "ok": bool(ra.get("ok") and rb.get("ok") and warned),
        "warned": warned,
        "a": _brief(ra),
        "b": _brief(rb),
    }


def probe_model_mismatch(job: Job) -> dict[str, Any]:
    """Site a trains first (its gateway's model is then established), b comes with one layer more."""
    a = _trainer(job, "a", "model", "--steps", "200")
    job.wait(lambda: job.status("a")["counters"]["trainer_pushes"] > 0, "site a's first push", TRAINER_S)
    b = _trainer(job, "b", "model", "--extra-layer")
    ra, rb = _result(job, "a", "model", a), _result(job, "b", "model", b)
    both = ra.get("error") == "ModelMismatch" and rb.get("error") == "ModelMismatch"
    named = "site b" in str(ra.get("message")) and "site a" in str(rb.get("message"))
    spread = max(float(ra.get("t_end", 1e18)), float(rb.get("t_end", 1e18))) - float(rb.get("t_init", 0.0))
    return {
        "ok": both and named and spread <= FAST_S,
        "every_site_within_s": round(spread, 3),
        "a": _brief(ra),
        "b": _brief(rb),
    }


def probe_relative_paths(work: Path) -> dict[str, Any]:
    """The demo's config writer and ``wanrt job init`` given relative paths, loaded from elsewhere."""
    from tools.harness.relative_demo_files import write_relative_demo_run
    from wanrt.job.files import write_job

    here = Path.cwd()
    problems: list[str] = []
    rel = work / "relative"
    rel.mkdir()
    try:
        os.chdir(rel)
        files = write_relative_demo_run()
        jobfiles = write_job(Path("job"), job="j", sites=["a", "b"], base_port=7700)
        os.chdir(work)  # another working directory
        for path in [f.config for f in files] + list(jobfiles.gateways.values()):
            try:
                load_gateway_config(path if path.is_absolute() else rel / path).credentials()
            except Exception as exc:
                problems.append(f"{path}: {exc}")
    finally:
        os.chdir(here)
    return {"ok": not problems, "problems": problems}


def _brief(r: dict[str, Any]) -> dict[str, Any]:
    return {k: r.get(k) for k in ("ok", "error", "message", "seconds", "steps") if r.get(k) is not None}


# -- attacks ----------------------------------------------------------------------------------------------


def _attacker(job: Job) -> MaliciousPeer:
    """Site a, with a's own valid keys (its gateway down), talking to site b."""
    key = job.configs["a"].credentials().for_peer("b")
    assert key is not None
    return MaliciousPeer("a", JOB, key, job.configs["b"].rounds)


async def probe_forged_join(job: Job) -> dict[str, Any]:
    peer = _attacker(job)
    got = await peer.handshake(
        job.configs["b"].listen, peer.info(frontier=999_987, fresh=False, join_at=10**6)
    )
    kept = False
    if not isinstance(got, str):
        _, transport = got
        try:
            kept = not await closed_within(transport, FAST_S)
        finally:
            with contextlib.suppress(Exception):
                await transport.close()
    status = job.status("b")
    listed = "a" in status["live"]
    return {
        "accepted": int(kept or listed),
        "listed_live": listed,
        "reason": status["peers"]["a"]["reason"][:200],
        "refusals": peer.refusals[-1:],
    }


async def _drop_big_frame(job: Job) -> bool:
    """Handshake as a (fresh), announce a 256 MiB frame, send 1 MiB of it, drop the link."""
    peer = _attacker(job)
    got = await peer.handshake(job.configs["b"].listen, peer.info(frontier=-1, fresh=True))
    if isinstance(got, str):
        return False
    conn, transport = got
    try:
        payload = SparsePayload.empty(0, 1024, 16)
        parts = [bytes(v) for v in conn.send_parts(Push(JOB, 0, 0, 1, "a", payload))]
        head = bytearray(parts[0])  # fixed header + header map: the body (the buffers) follows
        total = MAX_FRAME_BYTES - (1 << 16)
        struct.pack_into("!I", head, 16, total - len(head))  # body_len: the frame is ~256 MiB
        await transport.send([bytes(head), bytes(1 << 20)])
        await asyncio.sleep(0.2)  # let it arrive before the reset
    finally:
        await transport.close()  # a plain close (FIN), as a peer that drops the link
    return True


async def probe_closed_link_buffers(job: Job, rounds: int = 6) -> dict[str, Any]:
    """Six frame-and-drop cycles of ~0.7 s; b's RSS sampled throughout (peak) and 1 s after the last."""
    pid = int(job.ready["b"]["pid"])
    idle = _rss_mb(pid)
    peak = idle
    done = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _rss_mb(pid))
            await asyncio.sleep(0.02)

    sampler = asyncio.create_task(sample())
    sent = 0
    try:
        for _ in range(rounds):
            sent += int(await _drop_big_frame(job))
            await asyncio.sleep(0.5)
        await asyncio.sleep(0.5)  # one second after the last close (it closed 0.5 s ago)
        after = _rss_mb(pid)
    finally:
        done.set()
        await sampler
    return {
        "closed_link_buffer_mb": round(max(0.0, after - idle), 1),
        "attack_peak_mb": round(peak - idle, 1),
        "rss_idle_mb": round(idle, 1),
        "frames": sent,
    }


async def _flood(port: int, hosts: int, per_host: int, stop: asyncio.Event) -> None:
    async def one(source: str) -> None:
        while not stop.is_set():
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
            except OSError:
                await asyncio.sleep(0.05)
                continue
            try:
                stop_wait = asyncio.ensure_future(stop.wait())
                read = asyncio.ensure_future(reader.read())
                await asyncio.wait({stop_wait, read}, return_when=asyncio.FIRST_COMPLETED)
                for f in (stop_wait, read):
                    f.cancel()
            finally:
                writer.close()
            await asyncio.sleep(0.05)  # refused at once (a full host): try again, not in a tight loop

    await asyncio.gather(*(one(f"127.0.0.{2 + h}") for h in range(hosts) for _ in range(per_host)))


async def probe_preauth_flood(job: Job) -> dict[str, Any]:
    from gateways.service.peer_links import MAX_PREAUTH_PER_HOST, MAX_PREAUTH_TOTAL

    def rejoin() -> float:
        t0 = time.monotonic()
        job.start("a")
        job.wait(lambda: job.peer_state("b", "a") == "up", "site a to rejoin", 60.0)
        return time.monotonic() - t0

    quiet = await asyncio.to_thread(rejoin)
    job.stop("a", signal.SIGKILL)
    await asyncio.to_thread(job.wait, lambda: job.peer_state("b", "a") != "up", "site b to lose a")
    hosts = MAX_PREAUTH_TOTAL // MAX_PREAUTH_PER_HOST
    port = int(job.configs["b"].listen.rsplit(":", 1)[1])
    stop = asyncio.Event()
    flood = asyncio.create_task(_flood(port, hosts, MAX_PREAUTH_PER_HOST, stop))
    try:
        await asyncio.sleep(1.0)  # the slots fill
        flooded = await asyncio.to_thread(rejoin)
    except RuntimeError:
        flooded = float("inf")
    finally:
        stop.set()
        await flood
    return {
        "blocks": int(flooded > 2 * quiet),
        "rejoin_quiet_s": round(quiet, 2),
        "rejoin_flood_s": round(flooded, 2),
        "flood_hosts": hosts,
    }


# -- all of it --------------------------------------------------------------------------------------------


def run_probes(work_dir: str | Path | None = None) -> dict[str, object]:
    """Run every probe (see the module docstring) and return its keys."""
    t0 = time.monotonic()
    with contextlib.ExitStack() as stack:
        work = (
            Path(work_dir)
            if work_dir is not None
            else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        )
        job = Job(work)
        stack.callback(job.close)
        job.start("scheduler")
        for s in reversed(SITES):
            job.start(s)
        job.wait(lambda: job.peer_state("b", "a") == "up", "the gateways to link")
        mistakes = {
            "another_sites_key": probe_another_sites_key(job),
            "relative_paths": probe_relative_paths(work),
            "forgotten_close": probe_forgotten_close(job),
        }
        job.fresh_gateways()
        mistakes["model_mismatch"] = probe_model_mismatch(job)
        job.fresh_gateways()
        job.stop("a", signal.SIGKILL)  # site a's gateway is down: the attacker plays a
        job.wait(lambda: job.peer_state("b", "a") != "up", "site b to lose a")

        async def attacks() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
            forged = await probe_forged_join(job)
            buffers = await probe_closed_link_buffers(job)
            flood = await probe_preauth_flood(job)
            return forged, buffers, flood

        forged, buffers, flood = asyncio.run(attacks())
    failed = [name for name, m in mistakes.items() if not m["ok"]]
    return {
        "mistakes_failing_fast": failed or "all",
        "forged_join_accepted": forged["accepted"],
        "preauth_flood_blocks_rejoin": flood["blocks"],
        "closed_link_buffer_mb": buffers["closed_link_buffer_mb"],
        "rejoin_quiet_s": flood["rejoin_quiet_s"],
        "rejoin_flood_s": flood["rejoin_flood_s"],
        "rss_idle_mb": buffers["rss_idle_mb"],
        "attack_peak_mb": buffers["attack_peak_mb"],
        "mistakes": mistakes,
        "forged_join": forged,
        "elapsed_s": round(time.monotonic() - t0, 1),
    }


TARGETS = {
    "mistakes_failing_fast": "all",
    "forged_join_accepted": "0",
    "preauth_flood_blocks_rejoin": "0",
    "closed_link_buffer_mb": "<= 64",
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--work-dir", help="keep the job, logs and trainer results here (default: a temp dir)")
    args = ap.parse_args(argv)
    res = run_probes(args.work_dir)
    print(f"{'key':<30} {'value':>24} {'target':>10}")
    for key in (*TARGETS, "rejoin_quiet_s", "rejoin_flood_s", "rss_idle_mb", "attack_peak_mb", "elapsed_s"):
        print(f"{key:<30} {json.dumps(res[key]):>24} {TARGETS.get(key, ''):>10}")
    mistakes = res["mistakes"]
    assert isinstance(mistakes, dict)
    for name, m in mistakes.items():
        print(f"  mistake {name:<22} {'ok' if m['ok'] else 'NOT OK'}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
