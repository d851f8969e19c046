"""The real-DDP baseline arm: S × R ranks of plain PyTorch DDP (gloo) across the sites' network namespaces.

:func:`run_ddp` writes one :class:`~wanrt.demo.ddp_worker.WorkerSpec` per rank and the data split, starts
every rank with ``ip netns exec <site's namespace> python -m wanrt.demo.ddp_worker``, and supervises them:
their JSON lines arrive through one reader thread per rank, an exit with an error or a stall stops the run
with :class:`~wanrt.demo.failures.DemoFailed` naming the rank and its log, and every rank is terminated and
reaped on the way out (the namespaces' teardown would kill stragglers anyway). The clock starts when rank 0
leaves the barrier after every rank joined the group and built its model (the wanrt arms also start their
clock with connected, warm trainers). The result is a :class:`~wanrt.demo.results.RunResult` with mode
``"ddp"``, comparable field by field with the other arms'; its WAN bytes are the kernel's counters of the
sites' uplinks (headers included).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

import numpy as np

import wanrt
from wanrt.demo.config import DemoConfig, site_names
from wanrt.demo.ddp_worker import WorkerSpec
from wanrt.demo.failures import DemoFailed
from wanrt.demo.netns_sites import NetnsSites
from wanrt.demo.results import CurvePoint, RunResult
from wanrt.demo.workload.data import DigitsSplit, load_split

__all__ = ["DDP_LABEL", "DdpJob", "DdpRun", "run_ddp"]

#: how the table names the arm
DDP_LABEL: Final = "DDP (gloo)"
#: S × R ranks importing torch and joining one gloo group on a busy 2-core machine
BOOT_TIMEOUT_S: Final = 180.0
#: a rank that does not leave within this after SIGTERM is killed
STOP_TIMEOUT_S: Final = 10.0
#: the checkout this package was imported from: the ranks must import the same code
_ROOT: Final = str(Path(wanrt.__file__).resolve().parents[1])


@dataclass
class DdpRun:
    result: RunResult
    #: per global rank, (its own first-iteration gradient, the all-reduced one) when asked for
    gradients: dict[int, tuple[list[float], list[float]]] = field(default_factory=dict)


@dataclass
class _Rank:
    spec: WorkerSpec
    proc: subprocess.Popen[bytes]
    log: Path
    reader: threading.Thread

    @property
    def name(self) -> str:
        return f"ddp rank {self.spec.rank} (site {site_names(self.spec.site_index + 1)[-1]})"

    def failed(self, what: str) -> DemoFailed:
        code = self.proc.poll()
        status = "" if code is None else f" (exit code {code})"
        return DemoFailed(f"{self.name} {what}{status}", child=self.name, log=self.log)


def _read_lines(rank: int, stream: IO[bytes], out: queue.Queue[tuple[int, dict[str, Any] | None]]) -> None:
    for raw in stream:
        try:
            msg = json.loads(raw)
        except json.JSONDecodeError:
            continue  # a stray print from a library: the protocol is JSON lines only
        if isinstance(msg, dict):
            out.put((rank, msg))
    out.put((rank, None))


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = _ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _write_data(data: DigitsSplit, path: Path) -> None:
    np.savez(path, x_train=data.x_train, y_train=data.y_train, x_test=data.x_test, y_test=data.y_test)


def _stop(ranks: list[_Rank]) -> None:
    for r in ranks:
        if r.proc.stdin is not None:
            with contextlib.suppress(OSError):
                r.proc.stdin.close()  # a rank still waiting for "go" leaves on end of input
        if r.proc.poll() is None:
            r.proc.terminate()
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for r in ranks:
        try:
            r.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            r.proc.kill()
            r.proc.wait()
    for r in ranks:
        r.reader.join(timeout=5.0)
        if r.proc.stdout is not None:
            r.proc.stdout.close()


@dataclass
class _State:
    t_go: float | None = None
    booted: set[int] = field(default_factory=set)
    parameters: int = 0
    curve: list[CurvePoint] = field(default_factory=list)
    steps: list[tuple[int, float]] = field(default_factory=list)
    tta_s: float | None = None
    iters_to_target: int | None = None
    finished: dict[int, dict[str, Any]] = field(default_factory=dict)
    gradients: dict[int, tuple[list[float], list[float]]] = field(default_factory=dict)
    #: eval and step lines that arrived before rank 0's "go" (another rank's reader can be faster)
    early: list[dict[str, Any]] = field(default_factory=list)


class DdpJob:
    """The ranks of one DDP run: :meth:`start` spawns them (they import torch, join the group and wait),
    :meth:`run` starts the clock and trains, :meth:`close` stops and reaps whatever is left.

    Booting apart from running lets a benchmark boot the ranks while other processes boot too; the clock
    starts only at :meth:`run`, with every rank connected and its model built.
    """

    def __init__(
        self,
        cfg: DemoConfig,
        net: NetnsSites,
        out_dir: Path,
        *,
        label: str = "ddp",
        data: DigitsSplit | None = None,
        report_gradients: bool = False,
        on_line: Callable[[str], None] = print,
    ) -> None:
        if cfg.sites != net.sites:
            raise DemoFailed(f"the network has {net.sites} sites, the run {cfg.sites}", child="ddp")
        self.cfg = cfg
        self.net = net
        self.run_dir = out_dir / label
        self.label = label
        self._data = data
        self._report_gradients = report_gradients
        self._say = on_line
        self._lines: queue.Queue[tuple[int, dict[str, Any] | None]] = queue.Queue()
        self._ranks: list[_Rank] = []
        self._st = _State()

    def __enter__(self) -> DdpJob:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        data_path = self.run_dir / "digits.npz"
        _write_data(self._data if self._data is not None else load_split(cfg.seed), data_path)
        store = self.run_dir / "gloo.store"
        store.unlink(missing_ok=True)
        names = site_names(cfg.sites)
        for si in range(cfg.sites):
            for lr in range(cfg.ranks):
                spec = WorkerSpec(
                    rank=si * cfg.ranks + lr,
                    world=cfg.world,
                    site_index=si,
                    local_rank=lr,
                    store=str(store),
                    data=str(data_path),
                    hidden=cfg.model_hidden,
                    seed=cfg.seed,
                    batch=cfg.batch,
                    lr=cfg.lr,
                    optimizer=cfg.optimizer,
                    eval_every=cfg.eval_every,
                    target_loss=cfg.target_loss,
                    max_iters=cfg.max_iters,
                    evaluator=(si == 0 and lr == cfg.ranks - 1),
                    ifname=self.net.wan_device(si),
                    report_gradients=self._report_gradients,
                )
                spec_path = self.run_dir / f"rank{spec.rank}.json"
                spec_path.write_text(spec.to_json())
                log = self.run_dir / f"rank{spec.rank}-{names[si]}{lr}.log"
                argv = self.net.exec_argv(si, [sys.executable, "-m", "wanrt.demo.ddp_worker", str(spec_path)])
                with log.open("wb") as fh:
                    proc = subprocess.Popen(
                        argv,
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=fh,
                        env=_env(),
                        cwd=_ROOT,
                    )
                assert proc.stdout is not None
                reader = threading.Thread(
                    target=_read_lines,
                    args=(spec.rank, proc.stdout, self._lines),
                    name=f"ddp-{spec.rank}",
                    daemon=True,
                )
                reader.start()
                self._ranks.append(_Rank(spec, proc, log, reader))
        self._say(f"{self.label}: {len(self._ranks)} DDP ranks starting in {cfg.sites} namespaces")

    def run(self) -> DdpRun:
        """Wait until every rank has booted, start them, train to the stop; the ranks then exit."""
        cfg, st = self.cfg, self._st
        _supervise(cfg, self._ranks, self._lines, st, self._say, self.label, until_booted=True)
        up0, down0 = self.net.uplink_bytes(), self.net.downlink_bytes()
        for r in self._ranks:
            assert r.proc.stdin is not None
            r.proc.stdin.write(b"go\n")
            r.proc.stdin.flush()
        _supervise(cfg, self._ranks, self._lines, st, self._say, self.label, until_booted=False)
        up1, down1 = self.net.uplink_bytes(), self.net.downlink_bytes()
        names = site_names(cfg.sites)
        received = sum(down1.values()) - sum(down0.values())
        return DdpRun(_result(cfg, st, names, up1, up0, received), st.gradients)

    def close(self) -> None:
        ranks, self._ranks = self._ranks, []
        _stop(ranks)


def run_ddp(
    cfg: DemoConfig,
    net: NetnsSites,
    out_dir: Path,
    *,
    label: str = "ddp",
    data: DigitsSplit | None = None,
    report_gradients: bool = False,
    on_line: Callable[[str], None] = print,
) -> DdpRun:
    """Train ``cfg``'s model with real DDP over ``net``'s links to ``cfg.target_loss`` (or ``max_iters``).

    ``cfg`` gives the model, data seed, batch, optimizer, lr, stop rule and the sites × ranks layout;
    its link fields are not used (the links are ``net``'s). ``data`` saves reloading the split.
    """
    with DdpJob(
        cfg, net, out_dir, label=label, data=data, report_gradients=report_gradients, on_line=on_line
    ) as job:
        return job.run()


def _supervise(
    cfg: DemoConfig,
    ranks: list[_Rank],
    lines: queue.Queue[tuple[int, dict[str, Any] | None]],
    st: _State,
    on_line: Callable[[str], None],
    label: str,
    *,
    until_booted: bool,
) -> None:
    """Handle the ranks' lines until all booted (``until_booted``) or all finished; fail on a death or a
    stall."""
    by_rank = {r.spec.rank: r for r in ranks}
    last = time.monotonic()

    def done() -> bool:
        return len(st.booted if until_booted else st.finished) == len(ranks)

    while not done():
        limit = BOOT_TIMEOUT_S if until_booted else cfg.stall_timeout_s
        try:
            rank, msg = lines.get(timeout=1.0)
        except queue.Empty:
            for r in ranks:
                if r.proc.poll() not in (None, 0):
                    raise r.failed("exited unexpectedly") from None
            if time.monotonic() - last > limit:
                raise ranks[0].failed(f"no message from any DDP rank for {limit:.0f} s") from None
            continue
        last = time.monotonic()
        if msg is None:
            if rank not in st.finished:
                by_rank[rank].proc.wait(timeout=5.0)
                raise by_rank[rank].failed("exited before it finished")
            continue
        _handle(st, cfg, msg, on_line, label, len(ranks))


def _handle(
    st: _State, cfg: DemoConfig, msg: dict[str, Any], on_line: Callable[[str], None], label: str, world: int
) -> None:
    event = msg.get("event")
    if event == "booted":
        st.booted.add(int(msg["rank"]))
        st.parameters = int(msg["parameters"])
        if len(st.booted) == world:
            on_line(f"{label}: every rank joined the gloo group; training")
    elif event == "go" and int(msg["rank"]) == 0:
        st.t_go = float(msg["t"])
        early, st.early = st.early, []
        for m in early:
            _handle(st, cfg, m, on_line, label, world)
    elif event in ("step", "eval") and st.t_go is None:
        st.early.append(msg)
    elif event == "step":
        assert st.t_go is not None
        st.steps.append((int(msg["iteration"]), float(msg["t"]) - st.t_go))
    elif event == "eval":
        assert st.t_go is not None
        t = float(msg["t"]) - st.t_go
        point = CurvePoint(t, int(msg["iteration"]), float(msg["loss"]), float(msg["accuracy"]))
        st.curve.append(point)
        if st.tta_s is None and point.loss <= cfg.target_loss:
            st.tta_s, st.iters_to_target = t, point.iteration
    elif event == "gradients":
        st.gradients[int(msg["rank"])] = (list(msg["local"]), list(msg["reduced"]))
    elif event == "finished":
        st.finished[int(msg["rank"])] = msg


def _result(
    cfg: DemoConfig,
    st: _State,
    names: tuple[str, ...],
    up1: dict[str, int],
    up0: dict[str, int],
    received: int,
) -> RunResult:
    fin = list(st.finished.values())
    t_go = st.t_go if st.t_go is not None else min(float(f["t_last_step"]) for f in fin)
    evaluator = st.finished[cfg.ranks - 1]  # the last rank of the first site
    sent = {s: up1[s] - up0[s] for s in names}
    return RunResult(
        mode="ddp",
        iterations=max(int(f["iterations"]) for f in fin),
        target_loss=cfg.target_loss,
        tta_s=st.tta_s,
        iters_to_target=st.iters_to_target,
        train_s=max(float(f["t_last_step"]) for f in fin) - t_go,
        final_loss=float(evaluator["final_loss"]),
        final_accuracy=float(evaluator["final_accuracy"]),
        curve=tuple(sorted(st.curve, key=lambda p: p.iteration)),
        step_times=tuple(sorted(st.steps)),
        wan_bytes_sent=sum(sent.values()),
        wan_bytes_received=received,
        bytes_sent_per_site=sent,
        rounds_completed={},
        distinct_final_models=len({str(f["digest"]) for f in fin}),
        settings={"batch": cfg.batch, "density": 1.0, "staleness": 0},
        final_batch={names[int(f["site_index"])]: cfg.batch for f in fin if int(f["local_rank"]) == 0},
        samples=sum(int(f["samples"]) for f in fin),
    )
