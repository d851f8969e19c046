"""The demo's settings: one frozen dataclass, a default and a ``--quick`` preset, built from CLI flags.

Defaults are measured, not guessed (docs/demo.md): on a 2-core machine the default run (3 sites × 2 ranks,
100 Mbit/s, 40 ms RTT) reaches the target loss in both modes in about 2–3 minutes in total, and ``--quick``
(2 sites × 1 rank, a smaller model) in well under a minute and a half, for CI. A bad flag is reported as a
:class:`~wanrt.errors.ConfigError` whose ``key`` is the flag (``--bandwidth``), before any process starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, get_args

from gateways.rounds.topology import TOPOLOGY_KINDS, TopologyKind
from transports.urls import parse_duration, parse_rate
from wanrt.client.config import WireDtype
from wanrt.config import check
from wanrt.demo.straggler import StragglerSpec, parse_straggler
from wanrt.errors import ConfigError

__all__ = [
    "DEFAULT",
    "DEMO_MODES",
    "FLAG_OF",
    "QUICK",
    "DemoConfig",
    "DemoMode",
    "OptimizerKind",
    "config_from_args",
    "site_names",
]

OptimizerKind = Literal["sgd", "momentum", "adam", "adamw"]
#: ``--mode``: how wanrt exchanges (issue 23): every step (the sparse per-step exchange), DiLoCo's outer loop
#: (``wanrt.DiLoCo``: H inner steps, then one exchange of the pseudo-gradient), Streaming DiLoCo, or the
#: scheduler's choice among them (docs/scheduler.md "The mode choice")
DemoMode = Literal["per-step", "diloco", "streaming", "auto"]
DEMO_MODES: Final[tuple[DemoMode, ...]] = ("per-step", "diloco", "streaming", "auto")
#: where trainers may compute (DemoConfig.device)
DEVICES: Final = ("cpu", "cuda")
OPTIMIZERS: Final = ("sgd", "momentum", "adam", "adamw")

#: a learning rate that works for each optimizer on this model (``--optimizer`` without ``--lr`` uses it);
#: Adam's steps are lr-sized per element whatever the gradient, so it wants a far smaller one than SGD
DEFAULT_LR: Final = {"sgd": 0.3, "momentum": 0.05, "adam": 1e-3, "adamw": 1e-3}
#: every process of the demo shares two cores; beyond this the run measures the scheduler, not the WAN
MAX_PROCESSES: Final = 32
MAX_SITES: Final = 8


@dataclass(frozen=True)
class DemoConfig:
    """One demo comparison. Every run (dense and wanrt) uses the same values except the client's mode."""

    sites: int = 3
    ranks: int = 2
    #: rate of every emulated WAN link, each direction, bit/s
    bandwidth_bps: float = 100e6
    #: round-trip time between any two sites; each direction gets half as one-way delay
    rtt_s: float = 0.040
    jitter_s: float = 0.001
    #: put the last site on a fluctuating bandwidth trace (both directions of its links)
    fluctuating: bool = True
    #: the trace's lowest rate, as a fraction of ``bandwidth_bps`` (it moves between this and 1)
    trace_floor: float = 0.2
    #: the trace holds each rate this long
    trace_step_s: float = 2.0
    #: width of the MLP's two hidden layers: the model size, hence the dense exchange's size
    model_hidden: int = 512
    topology: TopologyKind = "tree"
    #: wanrt's fraction of gradient elements sent per layer (the dense baseline sends 1.0)
    density: float = 0.02
    #: wanrt's partial-staleness bound (the dense baseline uses 0, like DDP)
    staleness: int = 1
    #: wanrt's value coding on the wire (fp32, fp16, bf16, int8, int4, int2: docs/codec.md); the dense
    #: baseline sends fp32
    wire_dtype: WireDtype = "fp32"
    #: ``--mode``: compare the dense baseline with one wanrt arm per mode given, in the order given (empty:
    #: the default demo's arms, dense, wanrt and the scheduler's)
    modes: tuple[DemoMode, ...] = ()
    #: the outer loop's H (inner steps per outer step) of the ``diloco`` arm, and the ``auto`` arm's start
    #: (the scheduler then decides it); 16 is where the measured convergence factor of int2 at 3 % is still
    #: ~1.5× per-step's (docs/scheduler.md, "The mode choice")
    outer_steps: int = 16
    #: DiLoCo §3's outer Nesterov optimizer
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    #: the pseudo-gradient's density and value coding (SparseLoCo: 1–3 % with 2-bit values)
    outer_density: float = 0.03
    outer_wire: WireDtype = "int2"
    #: how the gateways send a round's result back to the sites under the outer loop (issue 23 item 1,
    #: docs/outer_loop.md "The result, low-bit"): ``wire`` re-codes it in ``outer_wire`` (when that is
    #: low-bit) where it is made, bounded to ``outer_result_density`` of each layer's blocks, the rest and the
    #: coding's error kept in that gateway's residual; ``exact`` sends the exact fp32 sum over the union
    #: of the sites' supports (what every gateway did before)
    outer_result_coding: Literal["exact", "wire"] = "wire"
    #: that bound as a fraction of a layer's blocks; 0: the sites' pseudo-gradients side by side
    #: (``sites × outer_density``, the union's size when no two sites pick the same block)
    outer_result_density: float = 0.0
    #: SGD with error feedback loses almost nothing to compression (see docs/demo.md for Adam)
    optimizer: OptimizerKind = "sgd"
    lr: float = 0.3
    #: samples per rank and iteration
    batch: int = 32
    #: training stops when the loss on the whole training split falls to this (cross-entropy)
    target_loss: float = 0.1
    max_iters: int = 400
    #: the loss on the training split is computed every this many iterations (one rank does it); 0 = never
    #: (throughput runs of big models, tools/bench_e2e.py: the target cannot be reached then)
    eval_every: int = 5
    seed: int = 0
    #: how long a gateway waits for a child subtree before closing a round without it; long, so the dense
    #: baseline stays a synchronous exchange even when the fluctuating link is at its slowest
    round_deadline_s: float = 30.0
    #: no progress from any trainer for this long stops the run with the trainers' log tails
    stall_timeout_s: float = 120.0
    #: also train with the scheduler (``wanrt scheduler``, adaptive policy) deciding density, per-site batch
    #: sizes and staleness: the third arm; ``--no-scheduler`` leaves the two fixed-setting arms
    scheduler: bool = True
    #: where the trainers compute: ``cpu``, or ``cuda`` (one rank per site per GPU, several sites may share
    #: one; the leader selects on the GPU, docs/client.md "On a GPU"); see :func:`check_device`
    device: Literal["cpu", "cuda"] = "cpu"
    #: how often the scheduler asks its policy (the daemon's default of 5 s suits jobs of hours; a demo run
    #: lasts 5–30 s at 10–25 iterations/s, where 5 s would mean one or two decisions per run)
    decide_interval_s: float = 0.5
    #: how often each gateway reports to the scheduler (the daemon's default 1 s, scaled like the above: the
    #: policy reads a sample of the trainers' iterations, and needs a few per decision)
    telemetry_interval_s: float = 0.25
    #: iterations between the newest frontier a gateway reported and a decision's effective iteration: the
    #: least a gateway accepts (its rounds' window of 3 + 2) plus one for a report up to one telemetry
    #: interval old; a gateway further ahead refuses and the scheduler prepares again (a round trip). The
    #: daemon's default of 8 costs seconds per decision when an iteration takes 0.5–1 s (the estimate does
    #: not move while a decision waits for its iteration)
    announce_margin: int = 6
    #: the scheduler's density warm-up, in epochs of the training split (Deep Gradient Compression's "first
    #: four epochs"; the controller counts iterations, and its default of 200 is longer than a whole demo
    #: run: an epoch here is ~7.5 iterations); 0: no warm-up
    warmup_epochs: float = 4.0
    #: the scheduler's exchange-latency window (``[scheduler.control] latency_window``, decide ticks): the
    #: demo's iterations compute in 10–40 ms against a 40 ms round trip, so the exchange's fixed cost paces
    #: them (docs/scheduler.md, "Latency"); 0: the paper's model
    latency_window: int = 16
    #: the scheduler's ``[scheduler.control] first_plan_settle``: the first plan waits until the bandwidth
    #: estimate moved less than this share between two decide ticks (the start-up readings under load are
    #: slow, scheduler/control/config.py); 0: off. The default workload's value is in :data:`DEFAULT`
    first_plan_settle: float = 0.0
    #: the analytic stand-in's critical batch (McCandlish's B_noise) for the demo's MLP, from its measured
    #: steps to the target: 220 at a total batch of 24, 195 at 48, 165 at 192 (docs/demo.md, the
    #: samples-to-target probes) fit steps ∝ 1 + B_noise/Σx with B_noise 10–12; past the configured batch
    #: the iterations do not fall (lr 0.3 is not scaled: 247 steps at 768), so the stand-in says so
    critical_batch: float = 12.0
    #: the stand-in's compression penalty ḡ at the demo's ``density`` (0.02), as this MLP measured it: the
    #: fixed arm needs 155–180 iterations to the target against the dense arm's 145 (docs/demo.md), about
    #: +10 %; the stand-in's own 0.05·(d^−0.5 − 1) says +30 % there and had the adaptive arm send 2–5× the
    #: bytes, at a cost in time, for iterations that did not fall (150–165 at densities 0.02–0.25)
    compression_penalty: float = 0.10
    #: ... and the exponent p of the stand-in's ``coef·(d^−p − 1)`` (``standin_density_exponent``); the
    #: default workload's (width 2048) measured values are in :data:`DEFAULT`
    compression_exponent: float = 0.5
    #: the scheduler's convergence profile ḡ (JSON from ``wanrt profile``); None: see ``auto_profile``
    profile: str | None = None
    #: with no ``profile``: profile the demo's own workload (``--profile auto``: ``wanrt.demo.profile_cache``,
    #: Algorithm 1 of StellaTrain §4.3, cached after the first run) rather than use the scheduler's analytic
    #: stand-in. Off by default: measured, the own-workload profile made the adaptive arm slower, not faster
    #: (docs/demo.md, "A profile of the demo's own workload")
    auto_profile: bool = False
    #: stop a run after this many seconds of training even before the target (0: only the target and
    #: ``max_iters`` stop it); benchmarks that follow a bandwidth trace for a fixed time use it
    max_train_s: float = 0.0
    #: the dense arm stops after this many seconds of training even before the target (0: no budget), and
    #: the table reports its speedup as a lower bound ("≥ N×": dense would have needed longer): on a link
    #: where the dense exchange is many times the compute it would otherwise run for many minutes
    dense_budget_s: float = 0.0
    #: when the dense arm stopped at ``dense_budget_s`` before the target: count its iterations to the target
    #: in a replay on unshaped links (:attr:`shaping` off), stopping at the target or after this many
    #: iterations (0: no replay). The dense arm's trajectory does not depend on the link (staleness 0: each
    #: update is applied at the iteration it was computed for; fixed density 1, batch, seed; no scheduler),
    #: so the replay's count is the shaped arm's; its time is not, and is never reported as one. Runs only
    #: with a ``dense_budget_s``
    dense_replay_max_iters: int = 200
    #: emulate the WAN links (``[gateway.shaping.*]``: rate, delay, trace); off only for the dense replay
    shaping: bool = True
    #: ``--straggler``: slow one site's trainers (wanrt/demo/straggler.py); the demo then compares the run
    #: with the scheduler's straggler mitigation off (``wanrt``) and on (``mitigated``)
    straggler: StragglerSpec | None = None
    #: AntDT's SleepDuration (1.5 s per iteration in §VII-A4) scaled to the demo: the delay per iteration
    #: at the configured batch and intensity 1; a few times the demo's own compute per iteration
    straggler_sleep_s: float = 0.25
    #: a transient straggler is slowed for the first half of every period (AntDT: 15 of every 30 minutes)
    straggler_period_s: float = 10.0
    #: the mitigating scheduler's windows L^trans / L^per (AntDT's 5 / 10 minutes, scaled to a run of
    #: 10–60 s) and λ (AntDT's footnote 3 lower bound, 1.3: with two sites a site 2× slower than the
    #: other is 1.33× the mean, which λ = 1.5 could never flag)
    straggler_short_s: float = 2.0
    straggler_long_s: float = 4.0
    straggler_slowness: float = 1.3

    def __post_init__(self) -> None:
        check(2 <= self.sites <= MAX_SITES, "sites", self.sites, f"must be in 2..{MAX_SITES}")
        check(1 <= self.ranks <= 8, "ranks", self.ranks, "must be in 1..8")
        check(
            self.sites * self.ranks <= MAX_PROCESSES,
            "ranks",
            self.ranks,
            f"sites × ranks must be <= {MAX_PROCESSES} trainer processes",
        )
        check(
            math.isfinite(self.bandwidth_bps) and 1e3 <= self.bandwidth_bps <= 1e11,
            "bandwidth_bps",
            self.bandwidth_bps,
            "must be a finite rate in 1 kbit/s .. 100 Gbit/s",
        )
        check(0.0 <= self.rtt_s <= 10.0, "rtt_s", self.rtt_s, "must be in 0..10 s")
        check(0.0 <= self.jitter_s <= 1.0, "jitter_s", self.jitter_s, "must be in 0..1 s")
        check(0.01 <= self.trace_floor <= 1.0, "trace_floor", self.trace_floor, "must be in [0.01, 1]")
        check(0.1 <= self.trace_step_s <= 600, "trace_step_s", self.trace_step_s, "must be in 0.1..600 s")
        check(1 <= self.model_hidden <= 16384, "model_hidden", self.model_hidden, "must be in 1..16384")
        check(self.topology in TOPOLOGY_KINDS, "topology", self.topology, f"one of {TOPOLOGY_KINDS}")
        check(0.0 < self.density < 1.0, "density", self.density, "must be in (0, 1); 1 is the baseline")
        check(0 <= self.staleness <= 4, "staleness", self.staleness, "must be in 0..4")
        modes = self.modes
        ok_modes = all(m in DEMO_MODES for m in modes) and len(set(modes)) == len(modes)
        check(ok_modes, "modes", modes, f"each of {', '.join(DEMO_MODES)} at most once")
        check(
            "streaming" not in modes,
            "modes",
            modes,
            "the demo has no streaming arm yet (wanrt.DiLoCo(fragments=P) exists: docs/outer_loop.md)",
        )
        check(1 <= self.outer_steps <= 20_000, "outer_steps", self.outer_steps, "must be in 1..20000")
        check(0.0 < self.outer_lr <= 10.0, "outer_lr", self.outer_lr, "must be in (0, 10]")
        check(0.0 <= self.outer_momentum < 1.0, "outer_momentum", self.outer_momentum, "must be in [0, 1)")
        check(0.0 < self.outer_density <= 1.0, "outer_density", self.outer_density, "must be in (0, 1]")
        check(self.outer_wire in get_args(WireDtype), "outer_wire", self.outer_wire, "a wire dtype")
        check(
            self.outer_result_coding in ("exact", "wire"),
            "outer_result_coding",
            self.outer_result_coding,
            "exact or wire",
        )
        check(
            0.0 <= self.outer_result_density <= 1.0, "outer_result_density", self.outer_result_density, "0..1"
        )
        wires = get_args(WireDtype)
        check(self.wire_dtype in wires, "wire_dtype", self.wire_dtype, f"one of {', '.join(wires)}")
        check(self.optimizer in OPTIMIZERS, "optimizer", self.optimizer, f"one of {OPTIMIZERS}")
        check(0.0 < self.lr <= 10.0, "lr", self.lr, "must be in (0, 10]")
        check(self.device in DEVICES, "device", self.device, f"one of {DEVICES}")
        check(1 <= self.batch <= 4096, "batch", self.batch, "must be in 1..4096")
        check(0.0 < self.target_loss < 10.0, "target_loss", self.target_loss, "must be in (0, 10)")
        check(1 <= self.max_iters <= 1_000_000, "max_iters", self.max_iters, "must be in 1..1e6")
        check(0 <= self.eval_every <= self.max_iters, "eval_every", self.eval_every, "0..max_iters")
        check(0 <= self.seed < 2**31, "seed", self.seed, "must be in 0..2**31-1")
        check(0.1 <= self.round_deadline_s <= 3600, "round_deadline_s", self.round_deadline_s, "0.1..3600 s")
        check(1.0 <= self.stall_timeout_s <= 3600, "stall_timeout_s", self.stall_timeout_s, "1..3600 s")
        check(0.01 <= self.decide_interval_s <= 60, "decide_interval_s", self.decide_interval_s, "0.01..60 s")
        check(
            0.01 <= self.telemetry_interval_s <= 60,
            "telemetry_interval_s",
            self.telemetry_interval_s,
            "must be in 0.01..60 s",
        )
        check(1 <= self.announce_margin <= 10_000, "announce_margin", self.announce_margin, "1..10000")
        check(0.0 <= self.warmup_epochs <= 1000, "warmup_epochs", self.warmup_epochs, "must be in 0..1000")
        check(
            isinstance(self.latency_window, int) and 0 <= self.latency_window <= 256,
            "latency_window",
            self.latency_window,
            "must be an integer in 0..256",
        )
        check(
            0 <= self.first_plan_settle < 1, "first_plan_settle", self.first_plan_settle, "must be in [0, 1)"
        )
        check(self.critical_batch > 0, "critical_batch", self.critical_batch, "must be > 0")
        check(
            0 <= self.compression_exponent <= 4,
            "compression_exponent",
            self.compression_exponent,
            "must be in [0, 4]",
        )
        check(
            0 <= self.compression_penalty <= 10,
            "compression_penalty",
            self.compression_penalty,
            "must be in [0, 10]",
        )
        check(0.0 <= self.max_train_s <= 86_400, "max_train_s", self.max_train_s, "0 (off) .. 86400 s")
        check(
            0.0 <= self.dense_budget_s <= 86_400, "dense_budget_s", self.dense_budget_s, "0 (off) .. 86400 s"
        )
        check(
            0 <= self.dense_replay_max_iters <= 1_000_000,
            "dense_replay_max_iters",
            self.dense_replay_max_iters,
            "must be in 0 (off)..1e6",
        )
        if self.straggler is not None:
            names = site_names(self.sites)
            check(self.straggler.site in names, "straggler", str(self.straggler), f"a site of {names}")
        check(0.0 < self.straggler_sleep_s <= 60, "straggler_sleep_s", self.straggler_sleep_s, "(0, 60] s")
        check(
            0.1 <= self.straggler_period_s <= 3600, "straggler_period_s", self.straggler_period_s, "0.1..3600"
        )
        check(
            0.0 < self.straggler_short_s <= 3600, "straggler_short_s", self.straggler_short_s, "(0, 3600] s"
        )
        check(
            self.straggler_short_s <= self.straggler_long_s <= 3600,
            "straggler_long_s",
            self.straggler_long_s,
            "must be in [straggler_short_s, 3600] s",
        )
        check(
            1.3 <= self.straggler_slowness <= 100, "straggler_slowness", self.straggler_slowness, "[1.3, 100]"
        )

    @property
    def world(self) -> int:
        return self.sites * self.ranks

    def outer_rounds(self) -> dict[str, Any]:
        """``[gateway.rounds]`` keys of an outer-loop arm: re-coded, capped results when the pseudo-gradient
        is low-bit and ``outer_result_coding`` is ``wire`` (gateways.rounds.result_coding), else none."""
        if self.outer_result_coding != "wire" or self.outer_wire not in ("int8", "int4", "int2"):
            return {}
        density = self.outer_result_density or min(1.0, self.sites * self.outer_density)
        return {"forward_policy": "cap", "forward_density": density, "result_coding": "wire"}


#: the default comparison (issue 25): a job whose WAN exchange matters, chosen by its exchange/compute ratios
#: and not by the results (docs/demo.md, "The default workload"). The MLP at width 2048 (4.35 M parameters,
#: 17 MB of fp32 gradient): measured on 2 cores (3 sites × 2 ranks, load 3–6), a compute-only iteration
#: takes 62 ms; at the fixed density 0.02 an iteration takes 159 ms at 100 Mbit/s (the WAN adds 1.6× the
#: compute) and 334 ms at 25 Mbit/s (the trace's 20–100 % moves it 2.1×), and a dense one 5.5 s (89×
#: compute). The dense arm therefore stops after 60 s of training and its speedup is reported as a lower
#: bound; the trace holds each rate 5 s so the estimate can be judged between steps. The whole demo took
#: 2 min 37 s. The earlier default (width 512, whose exchange fit inside the round trip) is
#: ``--model-hidden 512 --dense-budget 0 --trace-step 2s``; ``--quick`` stays the small CI run
#:
#: Its scheduler settings, measured on it (issue 25, session 10; docs/demo.md "Why the scheduler cannot gain
#: 1.25× here"): fixed-density runs (seed 0, no trace, 100 Mbit/s) needed 140 / 115 / 100 / 100 iterations at
#: densities 0.005 / 0.01 / 0.02 / 0.05, i.e. +40 % and +15 % below 0.02 and nothing gained above it. The
#: stand-in ``coef·(d^−p − 1)`` fits that with p = 1.5 and ḡ(0.02) = 0.06 (p = 0.5 and 0.10, measured on
#: width 512, said +10 % and +4 %, and the adaptive arm ran at 0.003–0.008). No density warm-up: a denser
#: start did not cut iterations (0.05 needs what 0.02 needs) and cost bytes (seed 2: adaptive/fixed 0.56 with
#: DGC's four epochs, 0.97 without, docs/demo.md).
#:
#: Its link (session 11, adapt5): 50 Mbit/s, the fluctuating site's trace 10–50 Mbit/s. At 100 Mbit/s (20–100)
#: the iteration was bound by the two cores, not the WAN: fixed-density runs measured 0.02 fastest at 100
#: Mbit/s, and from the per-iteration times at each rate a scheduler that knew the trace could gain at most
#: ~1.05–1.16× on the three seeds' traces (docs/demo.md, "Where a gain can come from"). At 50 Mbit/s the
#: fixed density's iteration is WAN-bound (195 ms against 138 ms at density 0.005, load 2–4) and the trace
#: moves it 3.2× (624 ms at 12.5 Mbit/s), as issue 25 asks. The first plan waits for the start-up estimate
#: to settle (``first_plan_settle``: it was made inside a 18–49 Mbit/s dip on a 100 Mbit/s link in 4 of 6
#: runs)
DEFAULT: Final = DemoConfig(
    bandwidth_bps=50e6,
    first_plan_settle=0.25,
    model_hidden=2048,
    dense_budget_s=60.0,
    trace_step_s=5.0,
    compression_penalty=0.06,
    compression_exponent=1.5,
    warmup_epochs=0.0,
)
#: for CI: two one-rank sites, a small model, a looser target; the larger batch keeps 2 ranks' SGD steady,
#: and density 0.05 lets the small layers (2560 elements) send more than a couple of blocks
QUICK: Final = DemoConfig(
    sites=2,
    ranks=1,
    model_hidden=256,
    batch=64,
    density=0.05,
    target_loss=0.3,
    max_iters=200,
    eval_every=5,
    stall_timeout_s=60.0,
    # its adaptive arm reaches the target in ~100 iterations, 4–5 s: at the default 0.5 s tick that is 8
    # decisions, and the latency mode's first plan (after 3–8 telemetry windows, then the announce margin)
    # took effect at iteration 85 or not at all; at 0.2 s it gets about as many ticks as the full demo
    decide_interval_s=0.2,
)

#: DemoConfig field -> the CLI flag that sets it, so errors name what the user typed
FLAG_OF: Final = {
    "device": "--device",
    "sites": "--sites",
    "ranks": "--ranks",
    "bandwidth_bps": "--bandwidth",
    "rtt_s": "--rtt",
    "dense_budget_s": "--dense-budget",
    "trace_step_s": "--trace-step",
    "fluctuating": "--fluctuating",
    "model_hidden": "--model-hidden",
    "topology": "--topology",
    "density": "--density",
    "staleness": "--staleness",
    "optimizer": "--optimizer",
    "lr": "--lr",
    "batch": "--batch",
    "target_loss": "--target-loss",
    "max_iters": "--max-iters",
    "eval_every": "--eval-every",
    "seed": "--seed",
    "scheduler": "--scheduler",
    "profile": "--profile",
    "straggler": "--straggler",
    "modes": "--mode",
    "outer_steps": "--outer-steps",
}


def check_device(cfg: DemoConfig) -> None:
    """Whether this machine can run ``cfg``'s trainers where it asks, before any process starts: a
    :class:`ConfigError` naming ``--device`` otherwise. With CUDA a site's ranks take distinct GPUs (NCCL
    inside the site: gloo cannot reduce CUDA tensors, and NCCL refuses two ranks on one GPU); sites share."""
    if cfg.device == "cpu":
        return
    import torch  # only here: the config module stays cheap to import

    if not torch.cuda.is_available():
        raise ConfigError(
            f"--device cuda: this torch ({torch.__version__}) sees no CUDA device; use --device cpu",
            key="--device",
            value=cfg.device,
        )
    gpus = torch.cuda.device_count()
    if cfg.ranks > gpus:
        raise ConfigError(
            f"--device cuda: {cfg.ranks} ranks per site need {cfg.ranks} GPUs (one each), this machine has "
            f"{gpus}; use --ranks {gpus} or fewer",
            key="--ranks",
            value=cfg.ranks,
        )


def site_names(n: int) -> tuple[str, ...]:
    """``a, b, c, ...``: short names keep unix socket paths and logs readable."""
    return tuple(chr(ord("a") + i) for i in range(n))


def _rekeyed(exc: ConfigError) -> ConfigError:
    key = exc.fields.get("key")
    flag = FLAG_OF.get(str(key))
    if flag is None:
        return exc
    message = exc.message.replace(repr(key), flag)
    return ConfigError(message, key=flag, value=exc.fields.get("value"))


def config_from_args(args: argparse.Namespace) -> DemoConfig:
    """The preset (``--quick`` or the default) with every flag the user gave applied, validated.

    Flags left unset are ``None`` in ``args`` and keep the preset's value. Rates and durations accept
    units (``100M``, ``1.5Gbit``; ``40ms``) and are parsed with the transports' own parsers.
    """
    base = QUICK if getattr(args, "quick", False) else DEFAULT
    changes: dict[str, Any] = {}
    if getattr(args, "bandwidth", None) is not None:
        changes["bandwidth_bps"] = parse_rate(str(args.bandwidth), key="--bandwidth")
    if getattr(args, "rtt", None) is not None:
        changes["rtt_s"] = parse_duration(str(args.rtt), key="--rtt")
    if getattr(args, "trace_step", None) is not None:
        changes["trace_step_s"] = parse_duration(str(args.trace_step), key="--trace-step")
    if getattr(args, "dense_budget", None) is not None:
        changes["dense_budget_s"] = parse_duration(str(args.dense_budget), key="--dense-budget")
    for name in FLAG_OF:
        if name in ("bandwidth_bps", "rtt_s", "dense_budget_s", "trace_step_s", "straggler", "modes"):
            continue
        value = getattr(args, name, None)
        if value is not None:
            changes[name] = value
    chosen = str(changes.get("profile")).lower()
    if chosen in ("none", "auto"):
        changes["profile"], changes["auto_profile"] = None, chosen == "auto"
    if changes.get("profile") is not None:
        profile = Path(str(changes["profile"])).expanduser()
        if not profile.is_file():
            raise ConfigError(f"--profile: no such file: {profile}", key="--profile", value=str(profile))
        changes["profile"] = str(profile.resolve())  # the scheduler's config lives in another directory
    mode = getattr(args, "mode", None)
    if mode is not None:  # "per-step,diloco": one arm per mode, in the order given
        changes["modes"] = tuple(m.strip() for m in str(mode).split(",") if m.strip())
    straggler = getattr(args, "straggler", None)
    if straggler is not None:
        sites = int(changes.get("sites", base.sites))
        spec = straggler if isinstance(straggler, StragglerSpec) else parse_straggler(str(straggler))
        if spec.site not in site_names(sites):
            raise ConfigError(
                f"--straggler: no site {spec.site!r} in this demo (sites: {', '.join(site_names(sites))})",
                key="--straggler",
                value=spec.site,
            )
        changes["straggler"] = spec
    if "optimizer" in changes and "lr" not in changes:
        changes["lr"] = DEFAULT_LR.get(str(changes["optimizer"]), base.lr)
    try:
        return dataclasses.replace(base, **changes)
    except ConfigError as exc:
        raise _rekeyed(exc) from None
