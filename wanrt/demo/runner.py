"""One demo comparison: spawn the trainers once, then per mode start the daemons, train, stop, collect.

The parent is a supervisor and a display, never a participant: it waits on every trainer pipe, every trainer
process sentinel and every gateway pidfd at once (:func:`multiprocessing.connection.wait`), so a message or
the death of any child wakes it immediately. Any failure stops the run with :class:`DemoFailed` naming the
child and showing its log; leaving the :class:`Demo` context (normally, on error, on Ctrl-C) stops every
child and reaps it.

Timeline of one mode: write configs → (``adaptive``: start the job's scheduler) → start S gateways and
wait for every ready file → send each trainer a :class:`RunOrder` → wait until all are connected
(:class:`Ready`) → :class:`Go` starts the clock → the evaluator's losses arrive; at the first one ≤ target
the :class:`StopControl` fixes the last iteration → all :class:`Finished` → SIGTERM the gateways, which
write their stats (WAN bytes), then the scheduler → its decisions file and the trace → :class:`RunResult`.

Modes: ``dense`` and ``wanrt`` (:data:`MODES`, fixed settings), ``adaptive`` (the scheduler decides; the
demo's third arm, :data:`ARMS`), ``local``: no gateways and no wanrt, each trainer on its own gradient
(the compute-only reference benchmarks divide by), and ``mitigated``: wanrt's fixed settings with the
scheduler's straggler policy (``--straggler``'s "mitigation on"). With ``DemoConfig.straggler`` set, the
straggling site's trainers are slowed in every mode (:class:`~wanrt.demo.straggler.Slowdown`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import multiprocessing
import multiprocessing.connection
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from transports.traces import BandwidthTrace
from wanrt.client.config import ClientConfig
from wanrt.codec.lowbit import CODING_BITS
from wanrt.demo.config import DemoConfig, site_names
from wanrt.demo.failures import DemoFailed
from wanrt.demo.profile_cache import CachedProfile, ensure_profile
from wanrt.demo.results import CurvePoint, DecisionPoint, RunResult
from wanrt.demo.sites.config_files import (
    fluctuating_trace,
    trace_in_run,
    write_run_files,
    write_scheduler_files,
    write_secret,
)
from wanrt.demo.sites.gateway_processes import (
    GATEWAY_COMMAND,
    DaemonProcess,
    GatewayProcess,
    read_stats,
    start_gateways,
    stop_daemon,
    stop_gateways,
    wait_ready,
)
from wanrt.demo.sites.scheduler_process import SCHEDULER_COMMAND, read_decisions, start_scheduler
from wanrt.demo.straggler import Slowdown
from wanrt.demo.trainers.messages import (
    Booted,
    Evaluated,
    Failed,
    Finished,
    Go,
    OuterSpec,
    Progress,
    Ready,
    RunOrder,
    TrainerMessage,
)
from wanrt.demo.trainers.processes import (
    EXIT_TIMEOUT_S,
    TrainerProcess,
    start_trainers,
    stop_trainers,
    trainer_specs,
)
from wanrt.demo.trainers.stop_control import StopControl
from wanrt.demo.workload.data import load_split
from wanrt.protocol.job_settings import JobSettings

if TYPE_CHECKING:
    from wanrt.demo.netns_sites import NetnsSites

__all__ = ["ALL_MODES", "ARMS", "MODES", "Demo", "Mode"]

Mode = Literal["dense", "wanrt", "adaptive", "local", "mitigated", "diloco", "auto"]
#: the two fixed-setting modes: the dense baseline and wanrt with the scheduler off
MODES: Final[tuple[Mode, ...]] = ("dense", "wanrt")
#: what ``wanrt demo`` compares: the fixed-setting modes and wanrt with the job's scheduler
ARMS: Final[tuple[Mode, ...]] = ("dense", "wanrt", "adaptive")
#: every mode a :class:`Demo` can run (each has its own stop-control slot); ``mitigated``: wanrt's fixed
#: settings plus the job's scheduler running the straggler policy (``--straggler``'s "mitigation on")
#: ``diloco``: the outer loop at a fixed H; ``auto``: the outer loop with the scheduler choosing the mode
#: and H (``--mode``, docs/scheduler.md "The mode choice")
ALL_MODES: Final[tuple[Mode, ...]] = ("dense", "wanrt", "adaptive", "local", "mitigated", "diloco", "auto")
#: modes that run the job's scheduler, and the policy it runs
SCHEDULER_POLICY: Final[dict[str, str]] = {
    "adaptive": "adaptive",
    "mitigated": "stragglers",
    "auto": "adaptive",
}
#: modes whose trainers run the outer loop (wanrt.DiLoCo)
OUTER_MODES: Final = ("diloco", "auto")
#: the auto arm's convergence factors (inner steps to the target over per-step exchange's 100) per H, measured
#: on real daemons on the default workload (3 sites × 2 ranks, int2 at 3 %, staleness 1; tools/bench_outer.py
#: runs of 14:26 and 14:37 UTC session 11): H 16 took 224 inner steps, 32 took 416, 64 took 1 472. The
#: in-process defaults of ``[scheduler.mode]`` (3 workers, synchronous: 2.4 at H 64) do not hold for 6
#: workers applying each average one outer step late, and had the 10 Mbit/s auto arm pick H 64
DEMO_OUTER_STEPS_FACTOR: Final = {16: 2.24, 32: 4.16, 64: 14.72}

#: starting S gateway daemons (Python imports, listeners) on a busy 2-core machine
GATEWAY_READY_TIMEOUT_S: Final = 60.0
#: spawning S × R trainers that each import torch and join their gloo group
BOOT_TIMEOUT_S: Final = 180.0
#: DemoConfig fields the trainer processes are started with (a run's ``links`` may change the others)
TRAINER_FIELDS: Final = (
    "sites",
    "ranks",
    "model_hidden",
    "optimizer",
    "lr",
    "batch",
    "seed",
    "device",
)
#: the parent wakes at least this often to check the stall deadline
WAKE_S: Final = 1.0


@dataclass
class _RunState:
    """What the parent learns while one mode runs."""

    mode: Mode
    slot: int
    cfg: DemoConfig
    t_go: float = 0.0
    ready: set[tuple[int, int]] = field(default_factory=set)
    site_iteration: dict[int, int] = field(default_factory=dict)
    curve: list[CurvePoint] = field(default_factory=list)
    #: (iteration, seconds since Go) at the end of each step of the first site's leader
    steps: list[tuple[int, float]] = field(default_factory=list)
    #: the trace the fluctuating site's links follow, and when its gateway started playing it (monotonic)
    trace: BandwidthTrace | None = None
    trace_origin: float | None = None
    tta_s: float | None = None
    iters_to_target: int | None = None
    stop_at: int | None = None
    #: the run was stopped by ``max_train_s`` before it reached the target
    budget_stop: bool = False
    finished: dict[tuple[int, int], Finished] = field(default_factory=dict)


class Demo:
    """Owns every child process of a comparison. Use as a context manager; call :meth:`run` per mode.

    ``progress`` turns the tqdm bars on; ``on_line`` receives one-line status messages.
    """

    def __init__(
        self,
        cfg: DemoConfig,
        out_dir: Path,
        *,
        progress: bool = True,
        on_line: Callable[[str], None] = print,
        gateway_command: Sequence[str] = GATEWAY_COMMAND,
        scheduler_command: Sequence[str] = SCHEDULER_COMMAND,
        netns: NetnsSites | None = None,
        profile_cache: Path | None = None,
    ) -> None:
        self.cfg = cfg
        #: where the demo's own convergence profile is cached (None: ``profile_cache.cache_dir()``)
        self.profile_cache = profile_cache
        #: the profile the adaptive run used when the demo made it (``auto_profile``), with its cost
        self.profile: CachedProfile | None = None
        #: sites on network namespaces: gateways run inside them and dial each other over shaped veths
        self.netns = netns
        self.out_dir = out_dir
        self.progress = progress
        self._say = on_line
        self._t0 = time.monotonic()
        self.gateway_command = tuple(gateway_command)
        self.scheduler_command = tuple(scheduler_command)
        self.parameters = 0
        self.train_samples = 0
        self._mp = multiprocessing.get_context("spawn")
        self._stops = StopControl(self._mp, len(ALL_MODES))
        self._trainers: list[TrainerProcess] = []
        self._gateways: list[GatewayProcess] = []
        self._scheduler: DaemonProcess | None = None
        self._sock_dir: Path | None = None
        self._secret: Path | None = None

    def say(self, text: str) -> None:
        """A status line, stamped with the seconds since the demo started."""
        self._say(f"[{time.monotonic() - self._t0:6.1f} s] {text}")

    # -- lifecycle ------------------------------------------------------------------------------------

    def __enter__(self) -> Demo:
        try:
            self._start()
        except BaseException:
            self._cleanup(graceful=False)
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self._cleanup(graceful=exc_type is None)

    def _start(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._sock_dir = Path(tempfile.mkdtemp(prefix="wanrt-demo-", dir="/tmp"))
        self._secret = write_secret(self.out_dir / "job.secret")
        specs = trainer_specs(
            self.cfg, out_dir=self.out_dir, store_dir=self._sock_dir, secret_file=self._secret
        )
        self.say(f"starting {len(specs)} trainer processes ({self.cfg.sites} sites × {self.cfg.ranks} ranks)")
        self._trainers = start_trainers(self._mp, specs, self._stops)
        data = load_split(self.cfg.seed)  # while the trainers import torch
        self.train_samples = len(data.y_train)
        for t in self._trainers:
            t.conn.send(data)
        booted: set[tuple[int, int]] = set()

        def on_boot(msg: TrainerMessage) -> None:
            if isinstance(msg, Booted):
                booted.add((msg.site_index, msg.rank))
                self.parameters = msg.parameters

        self._pump(on_boot, lambda: len(booted) == len(self._trainers), BOOT_TIMEOUT_S, "starting up")
        self.say("trainers up: torch imported, gloo groups joined, kernels warm")

    def _cleanup(self, *, graceful: bool) -> None:
        """Stop every child. After a failure, trainers may be blocked in a collective and never read an
        Exit order, so they are terminated without waiting."""
        try:
            stop_trainers(self._trainers, timeout_s=EXIT_TIMEOUT_S if graceful else 0.0)
        finally:
            self._trainers = []
            try:
                stop_gateways(self._gateways)
            finally:
                self._gateways = []
                try:
                    if self._scheduler is not None:
                        stop_daemon(self._scheduler)
                finally:
                    self._scheduler = None
                    if self._sock_dir is not None:
                        shutil.rmtree(self._sock_dir, ignore_errors=True)
                        self._sock_dir = None

    # -- one mode ------------------------------------------------------------------------------------

    @staticmethod
    def client_config(mode: Mode, cfg: DemoConfig) -> ClientConfig | None:
        """What the trainers start with: the dense baseline, wanrt's settings (the adaptive arm starts
        from the same ones and the scheduler takes over), or nothing (``local``: no wanrt)."""
        if mode == "local":
            return None
        if mode == "dense":
            return ClientConfig.dense_baseline()
        if mode in OUTER_MODES:  # the pseudo-gradient: SparseLoCo's density and value coding
            return ClientConfig(density=cfg.outer_density, staleness=cfg.staleness, wire_dtype=cfg.outer_wire)
        return ClientConfig(
            density=cfg.density,
            staleness=cfg.staleness,
            wire_dtype=cfg.wire_dtype,
        )

    @staticmethod
    def straggler_tables(cfg: DemoConfig) -> dict[str, dict[str, Any]]:
        """``[scheduler.stragglers.*]`` of the ``mitigated`` mode: AntDT's windows and λ scaled to the demo
        (``DemoConfig.straggler_*``); a split is announced only if Eq. 3 predicts the slowest site's batch
        time to drop by more than 10 % (measured throughputs on shared cores move by a few %). Every rank
        keeps at least an eighth of the configured batch (AntDT's B̂^min): the demo's data shards are
        fixed per rank, and AntDT's dynamic data sharding, which lets a starved worker's samples go to the
        others, is not what the demo exercises."""
        return {
            "detection": {
                "short_s": float(cfg.straggler_short_s),
                "long_s": float(cfg.straggler_long_s),
                "slowness": float(cfg.straggler_slowness),
            },
            "batch": {"rebalance_gain": 0.1, "min_batch": max(1, cfg.batch // 8)},
        }

    def scheduler_control(self, cfg: DemoConfig) -> dict[str, Any]:
        """The controller knobs the demo sets, both about scale rather than policy.

        * ``bytes_per_element``: what wanrt's codec sends per kept element — the wire dtype's bytes plus
          its block-index stream (≤ 1 byte per 16-element block; 4.03–4.07 bytes measured at fp32), not the
          controller's default 8 (StellaTrain's COO: fp32 value + int32 index per element). Eq. 6 and the
          bandwidth estimate turn bytes into seconds with it.
        * ``warmup_iterations``: ``warmup_epochs`` of the training split at the configured global batch.
        * ``latency_window``: the exchange's fixed cost L is measured (the demo's round trip paces its
          iterations); ``standin_*``: the analytic ḡ's batch term as the demo's MLP measured it (its critical
          batch; iterations that do not fall past the configured batch at the configured lr; its compression
          penalty at the configured density). Used only without a profile.
        """
        client = ClientConfig(density=cfg.density, staleness=cfg.staleness)
        value_bytes = 4.0 if client.wire_dtype == "fp32" else 2.0
        per_epoch = self.train_samples / max(1, cfg.batch * cfg.world)
        return {
            "bytes_per_element": value_bytes + 1.0 / client.block_size,
            "warmup_iterations": math.ceil(cfg.warmup_epochs * per_epoch),
            "latency_window": cfg.latency_window,
            "standin_critical_batch": float(cfg.critical_batch),
            "standin_batch_ref": float(cfg.batch * cfg.world),
            "standin_fixed_lr": True,
            # ḡ = coef·(d^−p − 1) equal to the measured penalty at the demo's density
            "standin_density_coef": float(cfg.compression_penalty)
            / (cfg.density**-cfg.compression_exponent - 1.0),
            "standin_density_exponent": float(cfg.compression_exponent),
            "first_plan_settle": float(cfg.first_plan_settle),
        }

    @staticmethod
    def mode_table(cfg: DemoConfig) -> dict[str, Any]:
        """``[scheduler.mode]`` of the ``auto`` arm: the mode choice on, over the one value coding the
        trainers connected with (``outer_wire``: wanrt.DiLoCo codes in the wire dtype, fixed at connect) at
        the pseudo-gradient density the arm runs (docs/scheduler.md, "The mode choice")."""
        return {
            "enabled": True,
            # its trainers run the outer loop: "per-step" for them is DiLoCo at H = 1, whose convergence
            # is not per-step exchange's (factor 1) and was not measured; at 100 Mbit/s that candidate
            # priced within the hysteresis of H = 16 and the arm switched back and forth (14:50 UTC run)
            "modes": ["diloco"],
            "codings": [cfg.outer_wire],
            "outer_density": {cfg.outer_wire: float(cfg.outer_density)},
            "per_step_coding": cfg.outer_wire,
            "outer_steps": list(DEMO_OUTER_STEPS_FACTOR),
            "steps_factor": {cfg.outer_wire: list(DEMO_OUTER_STEPS_FACTOR.values())},
            # results come back re-coded in the arm's coding when its gateways re-code them
            **({"sum_value_bytes": CODING_BITS[cfg.outer_wire] / 8 + 1 / 16} if cfg.outer_rounds() else {}),
        }

    def with_profile(self, cfg: DemoConfig) -> DemoConfig:
        """``cfg`` with the convergence profile the adaptive scheduler gets: the given file, else (with
        ``auto_profile``) the demo workload's own, from the cache or profiled now — before the run's clock
        starts, so its time is not in the time to target (StellaTrain's profile is offline, §4.3)."""
        if cfg.profile is not None or not cfg.auto_profile:
            return cfg
        if self.profile is None:
            self.profile = ensure_profile(
                cfg, directory=self.profile_cache, on_line=self.say, progress=self.progress
            )
        return dataclasses.replace(cfg, profile=str(self.profile.path))

    def run(
        self,
        mode: Mode,
        *,
        label: str | None = None,
        links: DemoConfig | None = None,
        trace: BandwidthTrace | None = None,
        scheduler_control: Mapping[str, Any] | None = None,
        batch: Mapping[str, int] | None = None,
    ) -> RunResult:
        """Train once in ``mode`` against freshly started daemons (identical links for every mode).

        ``links`` may change what the daemons and the stop rule see (bandwidth, RTT, trace, target,
        iteration cap, scheduler intervals) for this run; what the trainers were started with (model, data,
        sites, ranks, optimizer) must stay the same. ``label`` names the run's directory (default: the
        mode). ``trace`` replaces the fluctuating site's generated trace (its links follow it even with
        ``fluctuating`` off). ``scheduler_control`` sets ``[scheduler.control]`` knobs of the adaptive
        mode's scheduler. ``batch`` gives sites a per-rank batch other than the configured one.
        """
        assert self._sock_dir is not None and self._secret is not None
        cfg = self.cfg if links is None else links
        changed = [f for f in TRAINER_FIELDS if getattr(cfg, f) != getattr(self.cfg, f)]
        if changed:
            raise ValueError(f"links= may not change the trainers' settings: {', '.join(changed)}")
        label = label or mode
        if mode == "dense" and cfg.dense_budget_s > 0:
            budget = cfg.dense_budget_s if cfg.max_train_s <= 0 else min(cfg.max_train_s, cfg.dense_budget_s)
            cfg = dataclasses.replace(cfg, max_train_s=budget)
        slot = ALL_MODES.index(mode)
        job = f"wanrt-demo-{mode}"
        run_dir, sock_dir = self.out_dir / label, self._sock_dir / label
        state = _RunState(mode, slot, cfg)
        files = []
        sched_files = None
        if mode != "local":
            trace_file: Path | None = None
            if trace is not None or cfg.fluctuating:
                state.trace = trace if trace is not None else fluctuating_trace(cfg)
                trace_file = run_dir / "fluctuating-site.csv"
                trace_file.parent.mkdir(parents=True, exist_ok=True)
                state.trace.save(trace_file)
            scheduler_url = None
            if mode == "adaptive":
                cfg = self.with_profile(cfg)
            if mode in SCHEDULER_POLICY:
                sched_files = write_scheduler_files(
                    cfg,
                    job=job,
                    run_dir=run_dir,
                    sock_dir=sock_dir,
                    secret_file=self._secret,
                    control={**self.scheduler_control(cfg), **(scheduler_control or {})},
                    policy=SCHEDULER_POLICY[mode],
                    stragglers=self.straggler_tables(cfg) if mode == "mitigated" else None,
                    mode=self.mode_table(cfg) if mode == "auto" else None,
                )
                scheduler_url = sched_files.listen_url
                self._scheduler = start_scheduler(sched_files, command=self.scheduler_command)
            files = write_run_files(
                cfg,
                job=job,
                run_dir=run_dir,
                sock_dir=sock_dir,
                secret_file=self._secret,
                trace_file=trace_file,
                scheduler_url=scheduler_url,
                rounds=cfg.outer_rounds() if mode in OUTER_MODES else None,
            )
            netns = self.netns if cfg.shaping else None  # unshaped: plain local sockets, not the veths
            if netns is not None:
                netns.adapt_run_files(files)
            start = start_gateways if netns is None else netns.start_gateways
            self._gateways = start(files, command=self.gateway_command)
            daemons: list[DaemonProcess] = [*self._gateways]
            if self._scheduler is not None:
                daemons.append(self._scheduler)
            wait_ready(daemons, timeout_s=GATEWAY_READY_TIMEOUT_S)
            if state.trace is not None:
                state.trace_origin = self._gateways[-1].ready_written()
            with_scheduler = " and the scheduler" if self._scheduler is not None else ""
            self.say(f"{label}: {len(files)} gateways{with_scheduler} listening; trainers connecting")
        self._stops.arm(slot, cfg.max_iters)
        client = self.client_config(mode, cfg)
        outer = None
        if mode in OUTER_MODES:
            outer = OuterSpec(cfg.outer_steps, cfg.outer_lr, cfg.outer_momentum)
        slow = cfg.straggler
        for t in self._trainers:
            url = files[t.spec.site_index].trainer_url if files else ""
            own = None if batch is None else batch.get(t.spec.site)
            slowdown = None
            if slow is not None and slow.site == t.spec.site:
                slowdown = Slowdown.of(slow, cfg.straggler_sleep_s, cfg.batch, cfg.straggler_period_s)
            # the outer loop's parameters are the job's only at an outer step: evaluate at every one
            every = 1 if outer is not None and cfg.eval_every > 0 else cfg.eval_every
            t.conn.send(RunOrder(mode, slot, url, job, client, every, own, slowdown, outer))
        self._pump(
            lambda m: self._on_message(state, m, None),
            lambda: len(state.ready) == len(self._trainers),
            cfg.stall_timeout_s,
            f"{mode}: connecting to the gateways",
        )
        with self._bar(label, cfg.max_iters) as bar:
            state.t_go = time.monotonic()
            for t in self._trainers:
                t.conn.send(Go())
            self._pump(
                lambda m: self._on_message(state, m, bar),
                lambda: len(state.finished) == len(self._trainers),
                cfg.stall_timeout_s,
                f"{mode}: training",
            )
        iterations = max(f.iterations for f in state.finished.values())
        self.say(f"{label}: {iterations} iterations; stopping " + ("gateways" if files else "trainers"))
        codes = stop_gateways(self._gateways, one_by_one=True)
        gateways, self._gateways = self._gateways, []
        for g in gateways:
            if codes[g.files.site] != 0:
                # training is over and its results are in; a gateway's unclean exit is reported, and only
                # fails the run if it also lost the stats (read_stats below)
                self.say(f"warning: {g.name} exited with code {codes[g.files.site]} at shutdown; see {g.log}")
        decisions: list[dict[str, Any]] = []
        if self._scheduler is not None and sched_files is not None:
            sched, self._scheduler = self._scheduler, None
            code = stop_daemon(sched)
            if code != 0:
                self.say(f"warning: the scheduler exited with code {code} at shutdown; see {sched.log}")
            decisions = read_decisions(sched_files.decisions)
        stats = {g.files.site: read_stats(g) for g in gateways}
        return self._result(state, stats, decisions, batch)

    def replay_dense(self, dense: RunResult) -> RunResult | None:
        """The dense arm's iterations to the target when its shaped run stopped at ``dense_budget_s``: the
        same trainers, model, data, seed and dense settings again, on unshaped links (no rate, delay or
        trace), until the target or ``dense_replay_max_iters``. None when there is nothing to replay.

        Why the count carries over: the dense settings are staleness 0 (each iteration's update is applied
        at that iteration, whenever its bytes arrive), density 1 with no error feedback, the fixed batch and
        no scheduler, and the gateways sum in a fixed order; so the link changes only how long an iteration
        takes, never which model it produces. The replay's times are not the shaped arm's and are reported
        only as the replay's own (``dense_replay`` in the JSON)."""
        cfg = self.cfg
        if dense.reached or dense.budget_s is None or cfg.dense_replay_max_iters <= 0:
            return None
        client = self.client_config("dense", cfg)
        assert client is not None and client.staleness == 0  # what makes the count link-independent
        links = dataclasses.replace(
            cfg,
            shaping=False,
            fluctuating=False,
            dense_budget_s=0.0,
            max_train_s=0.0,
            max_iters=cfg.dense_replay_max_iters,
        )
        self.say(f"dense: counting its iterations to the target on unshaped links (≤ {links.max_iters} it)")
        return self.run("dense", label="dense-replay", links=links)

    @contextlib.contextmanager
    def _bar(self, label: str, max_iters: int) -> Iterator[Any]:
        if not self.progress:
            yield None
            return
        from tqdm import tqdm

        bar = tqdm(total=max_iters, desc=f"{label:>8}", unit="it", dynamic_ncols=True, leave=True)
        try:
            yield bar
        finally:
            bar.close()

    def _on_message(self, s: _RunState, msg: TrainerMessage, bar: Any) -> None:
        if isinstance(msg, Ready) and msg.run == s.mode:
            s.ready.add((msg.site_index, msg.rank))
        elif isinstance(msg, Progress) and msg.run == s.mode:
            s.site_iteration[msg.site_index] = msg.iteration
            if msg.site_index == 0:
                s.steps.append((msg.iteration, msg.t - s.t_go))
            if s.cfg.max_train_s > 0 and s.stop_at is None and msg.t - s.t_go >= s.cfg.max_train_s:
                s.stop_at = self._stops.stop_soon(s.slot)
                s.budget_stop = True
                if bar is not None:
                    bar.total = s.stop_at
            if bar is not None and len(s.site_iteration) == self.cfg.sites:
                done = min(s.site_iteration.values())
                bar.update(done - bar.n)
        elif isinstance(msg, Evaluated) and msg.run == s.mode:
            s.curve.append(CurvePoint(msg.t - s.t_go, msg.iteration, msg.train_loss, msg.test_accuracy))
            if s.tta_s is None and msg.train_loss <= s.cfg.target_loss:
                s.tta_s = msg.t - s.t_go
                s.iters_to_target = msg.iteration
                s.stop_at = self._stops.stop_soon(s.slot)
                if bar is not None:
                    bar.total = s.stop_at
            if bar is not None:
                bar.set_postfix(loss=f"{msg.train_loss:.3f}", acc=f"{msg.test_accuracy:.3f}", refresh=False)
        elif isinstance(msg, Finished) and msg.run == s.mode:
            s.finished[(msg.site_index, msg.rank)] = msg

    def _result(
        self,
        s: _RunState,
        stats: dict[str, dict[str, Any]],
        decisions: list[dict[str, Any]],
        batch: Mapping[str, int] | None,
    ) -> RunResult:
        fin = list(s.finished.values())
        evaluator = next(f for f in fin if f.site_index == 0 and f.rank == self.cfg.ranks - 1)
        iterations = max(f.iterations for f in fin)
        train_s = max(f.t_last_step for f in fin) - s.t_go
        sent: dict[str, int] = {}
        received = 0
        for site, st in stats.items():
            per_peer = st.get("per_peer") or {}
            if per_peer:
                sent[site] = sum(int(p.get("bytes_sent", 0)) for p in per_peer.values())
                received += sum(int(p.get("bytes_received", 0)) for p in per_peer.values())
            else:
                sent[site] = int(st.get("bytes_sent", 0))
                received += int(st.get("bytes_received", 0))
        names = site_names(self.cfg.sites)
        client = self.client_config(s.mode, s.cfg)
        settings: dict[str, Any] = {"batch": s.cfg.batch}
        if batch:
            settings.update(JobSettings(site_batch_size=batch).to_wire())
        if client is not None:
            settings.update(density=client.density, staleness=client.staleness)
        if s.mode in OUTER_MODES:  # the H it started with (wanrt.demo.mode_results counts inner steps by it)
            settings.update(outer_steps=s.cfg.outer_steps, wire_dtype=s.cfg.outer_wire)
        link_trace: tuple[tuple[float, float], ...] = ()
        if s.trace is not None:
            origin = s.trace_origin if s.trace_origin is not None else s.t_go
            link_trace = tuple(trace_in_run(s.trace, s.t_go - origin, train_s))
        return RunResult(
            mode=s.mode,
            iterations=iterations,
            target_loss=s.cfg.target_loss,
            tta_s=s.tta_s,
            iters_to_target=s.iters_to_target,
            train_s=train_s,
            final_loss=evaluator.final_loss,
            final_accuracy=evaluator.final_accuracy,
            curve=tuple(s.curve),
            step_times=tuple(s.steps),
            wan_bytes_sent=sum(sent.values()),
            wan_bytes_received=received,
            bytes_sent_per_site=sent,
            rounds_completed={site: int(st.get("rounds_completed", 0)) for site, st in stats.items()},
            distinct_final_models=len({f.digest for f in fin}),
            settings=settings,
            final_batch={names[f.site_index]: f.batch for f in fin if f.rank == 0},
            samples=sum(f.samples for f in fin),
            decisions=tuple(_decision_point(rec, s.t_go) for rec in decisions),
            link_trace=link_trace,
            budget_s=s.cfg.max_train_s if s.budget_stop and s.tta_s is None else None,
        )

    # -- supervision ---------------------------------------------------------------------------------

    def _pump(
        self,
        handle: Callable[[TrainerMessage], None],
        done: Callable[[], bool],
        stall_s: float,
        phase: str,
    ) -> None:
        """Handle trainer messages until ``done()``; any child's death or a stall raises DemoFailed."""
        by_conn: dict[Any, TrainerProcess] = {t.conn: t for t in self._trainers}
        by_sentinel: dict[Any, TrainerProcess] = {t.process.sentinel: t for t in self._trainers}
        daemons: list[DaemonProcess] = [*self._gateways]
        if self._scheduler is not None:
            daemons.append(self._scheduler)
        pidfds = [d.pidfd for d in daemons if d.pidfd is not None]
        last = time.monotonic()
        while not done():
            ready = multiprocessing.connection.wait([*by_conn, *by_sentinel, *pidfds], timeout=WAKE_S)
            for d in daemons:
                d.check_alive()  # also covers a missing pidfd
            for obj in ready:
                if obj in by_conn:
                    self._receive(by_conn[obj], handle)
                    last = time.monotonic()
                elif obj in by_sentinel:
                    self._drain_dead(by_sentinel[obj], handle)
            if time.monotonic() - last > stall_s:
                leader = self._trainers[0]
                raise DemoFailed(
                    f"no message from any trainer for {stall_s:.0f} s while {phase}; "
                    f"logs are in {self.out_dir}",
                    child=leader.name,
                    log=leader.spec.log,
                )

    def _receive(self, t: TrainerProcess, handle: Callable[[TrainerMessage], None]) -> None:
        try:
            msg = t.conn.recv()
        except (EOFError, OSError):
            t.process.join(5.0)
            raise t.failed("exited unexpectedly") from None
        if isinstance(msg, Failed):
            t.process.join(5.0)
            raise t.failed(f"failed: {msg.message}")
        handle(msg)

    def _drain_dead(self, t: TrainerProcess, handle: Callable[[TrainerMessage], None]) -> None:
        """A trainer exited: deliver what it said last (its Failed message names the cause), then fail."""
        while t.conn.poll():
            self._receive(t, handle)
        t.process.join(5.0)
        raise t.failed("exited unexpectedly")


def _decision_point(rec: Mapping[str, Any], t_go: float) -> DecisionPoint:
    """A decisions-file line on the run's clock (the daemon writes this host's monotonic time)."""

    def num(key: str) -> float | None:
        v = rec.get(key)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    decision, effective = num("decision"), num("effective_iteration")
    values = rec.get("values")
    step = rec.get("bandwidth_step")
    reason = rec.get("reason")
    return DecisionPoint(
        t=(num("monotonic") or t_go) - t_go,
        kind=str(rec.get("kind", "")),
        decision=None if decision is None else int(decision),
        effective_iteration=None if effective is None else int(effective),
        values=dict(values) if isinstance(values, Mapping) else None,
        bandwidth_estimate_bps=num("bandwidth_estimate_bps"),
        bandwidth_step=None if step is None else str(step),
        reason=str(reason) if isinstance(reason, str) and reason else None,
    )
