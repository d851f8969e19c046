"""Every knob of the scheduler's decision objects, in one frozen dataclass (TOML section ``[scheduler]``).

Defaults are the paper's values where StellaTrain gives one (§4.1–4.3: the 5 % idle threshold, the
compression range ``[0, 0.999]`` and total batch range ``4..1024`` of Algorithm 1) and ours otherwise; each
field's comment says which, and why. Load with ``wanrt.config.from_mapping(SchedulerConfig, table,
section="scheduler")``: an unknown key, a wrong type or a value out of range is a
:class:`~wanrt.errors.ConfigError` naming ``scheduler.<field>``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Final, Literal

from wanrt.config import check

__all__ = ["SECTION", "Eq6Latency", "Eq6Time", "SchedulerConfig"]

SECTION: Final = "scheduler.control"  # the table inside job.toml ([scheduler] is the daemon's)

#: which per-rank compute time Eq. 6 must cover: every rank's (the paper's literal "r ≥ 1 − B/m · x_i/f_i"
#: for each i), or only the slowest rank's (what a pipeline that starts the exchange when the last rank of
#: the iteration is done needs)
Eq6Time = Literal["each_rank", "slowest_rank"]

#: what Eq. 6 is once the exchange has a measured latency L: a constraint whenever some candidate meets it
#: (the paper's reading: communication hidden behind compute), or only a price (every candidate paced at
#: ``max(compute, exchange)``, the bytes' time traded against ḡ; the model before issue 9)
Eq6Latency = Literal["impose", "price"]
RxFilter = Literal["median", "max"]


@dataclass(frozen=True)
class SchedulerConfig:
    """Throughput fit, bandwidth estimate, configuration search, re-planning, warm-up, staleness."""

    # -- ② GPU throughput model, Eq. 2 ----------------------------------------------------------------
    #: observations kept per rank (oldest dropped): a GPU's speed drifts (thermals, co-tenants), so an
    #: unbounded history would fit a GPU that no longer exists; 64 iterations still average out noise
    throughput_window: int = 64
    #: distinct batch sizes needed before (α, β) are fitted by Nelder–Mead; with fewer, the observed point is
    #: taken as the knee (α = x, β = f(x)): the conservative reading, "a larger batch will not run faster"
    throughput_min_batches: int = 2

    # -- ③ bandwidth estimate from the GPU idle rate, §4.1 ------------------------------------------------
    #: the estimate before any telemetry, bit/s (the paper's WAN averaged 115.7 Mbit/s, §5)
    bw_initial_bps: float = 100e6
    bw_min_bps: float = 1e5
    #: link-capacity ceiling (a NIC rate): raising never goes above it
    bw_max_bps: float = 100e9
    #: idle below this → the estimate is raised, otherwise lowered (paper: 5 %)
    bw_idle_threshold: float = 0.05
    #: a lowered estimate is set so that the next plan idles this much (below the threshold, so the loop
    #: settles where the paper wants it: communication just hidden)
    bw_target_idle: float = 0.025
    #: the first raise after a lowering, as a fraction (+10 %); at least the re-plan threshold, so a raise is
    #: always tested by a new plan
    bw_raise_initial: float = 0.10
    #: each consecutive raise multiplies the raise step by this (slow-start-like: a 30 → 100 Mbit/s step is
    #: found in ~4 decisions instead of ~13 at a fixed +10 %)
    bw_raise_growth: float = 2.0
    #: the largest single raise (×2)
    bw_raise_max: float = 1.0
    #: after a lowering, this many low-idle decisions hold the estimate before it is probed upwards again:
    #: the lowering just measured the link, and probing at once would overrun it every other decision
    bw_raise_hold: int = 2
    #: the largest single lowering (to 20 % of the estimate): one noisy idle sample cannot crash the estimate
    bw_lower_max: float = 0.8
    #: paced probing once the links' delivery rate has measured the link (BBR's ProbeBW: one probe per round
    #: of samples, not a slow-start). While no link backlogs (its tails cross too fast to time: censored),
    #: a raise multiplies the estimate by ``bw_probe_gain`` and then holds for ``bw_probe_every`` decide
    #: ticks, the time a plan takes to come into force and its samples to come back (announce margin plus
    #: telemetry: ~4 ticks measured in the real-daemon step run). A probe the links then measure at less
    #: than ``bw_probe_gain`` × the rate before it failed (the link had no more): the next one waits twice as
    #: long, up to ``bw_probe_every_max`` ticks, so a link that stays censored is not probed every few ticks.
    #: Without pacing (``bw_probe_every`` 0) the slow-start above raised every tick, outran the samples and
    #: overshot to the prior (an upward step read 200 Mbit/s on a 100 Mbit/s link at its 10th tick)
    bw_probe_every: int = 4
    bw_probe_every_max: int = 32
    bw_probe_gain: float = 2.0
    #: lowering observations fitted as exchange = latency + bytes / bandwidth (0: the paper's rule alone,
    #: the default). When payloads change but exchange time does not, the idle is latency or CPU, not
    #: bandwidth: with a window the estimate holds or moves up instead of spiralling down on a latency-
    #: bound link. Off by default: in the full real-daemon benchmark the fit's upward moves overshot after a
    #: step change of the link (error 4.6 at the 10th decision vs 0.67 with the paper's rule).
    bw_fit_window: int = 0
    #: raise only if the payload in flight needed at least this fraction of the estimate during the compute
    #: time; otherwise a low idle says nothing about the estimate (a small payload hides behind any link)
    bw_raise_min_utilisation: float = 0.5
    #: the estimate is never below this fraction of the goodput the gateways measured (they saw it carried)
    goodput_floor: float = 0.8
    #: while idle is high (the link is the bottleneck) the estimate is never above this multiple of goodput
    goodput_ceiling: float = 1.5
    #: a goodput sample older than this is ignored (after a rate change it describes another link)
    goodput_max_age_s: float = 30.0
    #: the estimate is never below this fraction of the slowest link's rate *while sending* (bytes over the
    #: gateways' busy time: the link demonstrably carried that); 0 turns the link-rate floor off. 1.0: the
    #: measured rate already includes the acknowledgement round trip, so it is below the link (§6: keep
    #: the estimate conservative)
    link_rate_floor: float = 1.0
    #: a link's rate is measured over at least this much busy time (shorter spans are one message's
    #: latency, not a rate)
    link_rate_min_busy_s: float = 0.1
    #: the floor needs every link measured within this age (a link not measured recently may be the
    #: bottleneck; one stale this long is the old topology's and is forgotten after ``4 ×`` this)
    link_rate_max_age_s: float = 3.0
    #: the links' delivery rate while backlogged (bytes the bottleneck released while bytes queued for it,
    #: over that time: TCP's delivery-rate sample) *sets* the estimate when a link measured one within
    #: ``link_rate_max_age_s``: it is B itself, not a bound (:mod:`scheduler.control.link_rate`). False:
    #: only the idle rule and the floors
    link_delivery: bool = True
    #: a link's delivery rate is measured over at least this many backlogged seconds (one chunk's release
    #: is scheduling jitter, not a rate)
    link_delivery_min_s: float = 0.02
    #: a link's delivery rate is the best of its windows within this age (BBR's max filter, whose window
    #: is ~10 round trips); older windows are forgotten, so a link that got faster and no longer backlogs
    #: stops holding the estimate down this long after its last slow window
    link_delivery_max_age_s: float = 1.0
    #: ... and only once it has this many windows within that age: one window alone may be one message
    #: whose acknowledgement waited on a loaded peer (3.6 Mbit/s read on a 100 Mbit/s link at load 3)
    link_delivery_min_samples: int = 3
    #: the receivers' tail-dispersion rate (``link.<sender>.rx_bytes|rx_s``) replaces a link's sender-side
    #: delivery sample while it has a fresh one: it excludes a policed link's burst, which the sender's
    #: sample reads as rate (gateways/sending/rx_dispersion.py). False: the sender's samples alone
    link_rx: bool = True
    #: the filter over a link's recent receiver-tail windows (same age and count as the delivery's):
    #: "median" or "max" (docs/scheduler.md has the numbers that chose it)
    link_rx_filter: RxFilter = "median"
    #: the receiver-tail windows the filter looks at are at most this old. Longer than the sender's
    #: ``link_delivery_max_age_s``: a median needs more windows than a max to see past outliers — with
    #: 1 s (2-4 windows) two slow tails into a loaded root gateway in a row read a 30 Mbit/s link as
    #: 18.6 Mbit/s at the full bench's 10th tick (docs/scheduler.md)
    link_rx_max_age_s: float = 2.0
    #: a direction whose delivery rate reached this share of its sender's pacing rate (the gateway's
    #: ``link.<peer>.rate_bps``: the straggler allocator's rate, or the configured base) was limited by
    #: wanrt's own pacer, not the link — BBR's application-limited sample — and is left out of the min:
    #: after the 30 Mbit/s step, five reallocations had paced the root's healthy link at 0.85^5 of
    #: 100 Mbit/s and it read 47-58 Mbit/s
    link_paced_share: float = 0.8
    #: the gateways' timed probe trains (``link.<sender>.probe_bytes|probe_s`` from the receiver,
    #: gateways/sending/probe_trains.py): a link's probe rate is the best train window within this age (a
    #: train is asked for once a second at most; a receiver that stalled reads one train slow) and sets
    #: the link's rate unless the receiver's tails measured it more recently. 0: trains are ignored
    link_probe_max_age_s: float = 1.5
    #: the exchange's latency (ours; 0: off, the paper's model): estimator observations the fixed part L of
    #: an exchange ``L + bytes / B`` is measured over (:mod:`scheduler.control.latency`). The paper's
    #: iteration is GPU compute against bytes / B; at 40 ms of round trip and a few ms of compute, the
    #: round trip paces the iteration and the idle rule reads it as a slow link (docs/scheduler.md)
    latency_window: int = 0
    #: with the latency on, the first plan also waits (at most ``FIRST_PLAN_SETTLE_MAX_WINDOWS`` windows)
    #: until the bandwidth estimate moved by less than this share between two decide ticks; 0: off. The
    #: first receiver-tail and train readings come while every process is starting and read the link slow
    #: (the demo: 18–49 Mbit/s for 1–1.5 s on a 100 Mbit/s link in 4 of 6 runs, issue 25), and a first plan
    #: made then ran the job at a density for a link a third as fast until the next re-plan
    first_plan_settle: float = 0.0
    #: with the latency on, an exchange that paced the iteration says something about B only if its bytes'
    #: predicted time at the estimate is at least this share of L (below, the bytes are lost in the
    #: latency's own jitter and the estimate holds, as ``bw_raise_min_utilisation`` holds a hidden one)
    latency_min_byte_share: float = 0.25
    #: the analytic stand-in ḡ's critical batch (McCandlish et al. 2018's B_noise: samples to a loss grow
    #: as 1 + Σx / B_noise), used when the job has no profile, and the batch it is relative to. 512 and
    #: 128 are the stand-in's long-standing batch term 0.2·(Σx/128 − 1)
    standin_critical_batch: float = 512.0
    standin_batch_ref: float = 128.0
    #: the stand-in's iterations do not fall past ``standin_batch_ref`` (a learning rate tuned there and
    #: not scaled with the batch; :class:`~scheduler.control.convergence.PowerLawConvergence`)
    standin_fixed_lr: bool = False
    #: the stand-in's compression term ``density_coef · ((1 − r)^−p − 1)`` (its long-standing 0.05) and p,
    #: ``standin_density_exponent`` (its long-standing 0.5; the demo's width-2048 MLP measured 1.5:
    #: +15 % iterations at density 0.01 and +40 % at 0.005 over 0.02, where p = 0.5 said +4 % and +10 %)
    standin_density_coef: float = 0.05
    standin_density_exponent: float = 0.5

    # -- ④ configuration search, Eq. 1–6 -----------------------------------------------------------------
    #: λ of Eq. 1, weighting the coefficient of variation (Eq. 3) against TTA; TTA enters normalised by the
    #: ideal 1/Σβ_i, so both terms are dimensionless (the paper gives no value; ours)
    tta_lambda: float = 0.5
    min_batch: int = 1
    #: the largest batch one rank may get (GPU memory: an RTX 4090 fits ResNet-50 at 256, §4.2)
    max_batch: int = 256
    #: Algorithm 1's total batch range (4..1024)
    min_total_batch: int = 4
    max_total_batch: int = 1024
    #: Algorithm 1's compression-rate range; r = 1 − density
    r_min: float = 0.0
    r_max: float = 0.999
    #: wire bytes per kept gradient element: an fp32 value and an int32 index (COO, §3.2). With the paper's
    #: ViT-B/16 (88 M parameters) this puts Eq. 6 exactly at Fig. 14a's r = 0.97 for Σx = 137 at 1 Gbit/s
    bytes_per_element: float = 8.0
    eq6_iteration_time: Eq6Time = "each_rank"
    #: with a latency L > 0: impose Eq. 6 ``r ≥ 1 − B/(h·m) · (t_i − L)`` whenever a candidate in the
    #: ranges satisfies it (the paper's reading, §4.2), pricing only where none does; ``"price"`` (the
    #: default, the model before issue 9): never impose it (search.py's module docstring)
    eq6_with_latency: Eq6Latency = "price"
    #: h, payloads one exchange carries *in series* over B: the exchange takes ``L + h · (1 − r) · m / B``.
    #: 1 is the paper's model (one payload over one link). A one-root round sends a payload up and the
    #: root's aggregate (up to ``sites`` payloads) down: :func:`scheduler.control.serial_payloads.
    #: serial_payloads` gives h for each gateway topology, to set here by hand (the demo keeps 1: with
    #: "impose" it cost iterations and moved no overhead, docs/comm_overhead.md)
    exchange_serial_payloads: float = 1.0
    #: at most this many total batch sizes are evaluated per search (all integers when the range is smaller)
    search_batch_candidates: int = 512
    #: compression rates tried per total batch besides Eq. 6's bound, evenly spaced in −log10(1 − r)
    search_r_candidates: int = 48
    #: polish the best candidate with Nelder–Mead (the paper's method, §4.2) when there are at most this
    #: many ranks (the simplex degrades in high dimension; 0 disables)
    search_polish_max_ranks: int = 16

    # -- when to re-plan -----------------------------------------------------------------------------------
    #: re-plan at least this often even when nothing changed (a slow drift of fitted throughputs)
    replan_period_s: float = 30.0
    #: re-plan when the bandwidth estimate moved this much relative to the one the plan used
    #: (half the first raise step, so a raise and the lowering after it are both followed by a new plan)
    replan_bandwidth_change: float = 0.05
    #: re-plan when the exchange latency L (``latency_window`` > 0) moved this much relative to the one the
    #: plan used: L jitters by ±10 % tick to tick on a loaded machine, a plan per jitter would churn
    replan_latency_change: float = 0.2
    #: never re-plan more often than this (each plan is announced to every site)
    replan_min_interval_s: float = 0.5

    # -- density warm-up (ours; Deep Gradient Compression's exponential sparsity warm-up) ----------------
    #: iterations over which the density decays from ``warmup_start_density`` to the searched one; 0: off
    warmup_iterations: int = 200
    warmup_start_density: float = 0.25
    #: the decay is geometric in this many equal stages (each stage is one announced decision)
    warmup_stages: int = 4

    # -- staleness bound decision ---------------------------------------------------------------------------
    #: staleness 1 is chosen only if it saves at least this fraction of time-to-accuracy over 0
    staleness_min_gain: float = 0.05
    #: relative loss penalty of staleness 1 over 0, used when the convergence profile did not measure one
    staleness_penalty_default: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, float):
                check(math.isfinite(v), f.name, v, "must be finite")
        pos_int = ("throughput_window", "throughput_min_batches", "min_batch", "max_batch", "warmup_stages")
        for name in pos_int:
            v = getattr(self, name)
            check(isinstance(v, int) and v >= 1, name, v, "must be an integer >= 1")
        check(
            self.throughput_min_batches <= self.throughput_window,
            "throughput_min_batches",
            self.throughput_min_batches,
            "must be <= throughput_window",
        )
        check(
            0 < self.bw_min_bps <= self.bw_initial_bps <= self.bw_max_bps,
            "bw_initial_bps",
            self.bw_initial_bps,
            "need 0 < bw_min_bps <= bw_initial_bps <= bw_max_bps",
        )
        check(
            0 < self.bw_idle_threshold < 1, "bw_idle_threshold", self.bw_idle_threshold, "must be in (0, 1)"
        )
        check(
            0 <= self.bw_target_idle < self.bw_idle_threshold,
            "bw_target_idle",
            self.bw_target_idle,
            "must be in [0, bw_idle_threshold)",
        )
        check(
            0 < self.bw_raise_initial <= self.bw_raise_max,
            "bw_raise_initial",
            self.bw_raise_initial,
            "must be in (0, bw_raise_max]",
        )
        check(self.bw_raise_max <= 10, "bw_raise_max", self.bw_raise_max, "must be <= 10")
        check(1 <= self.bw_raise_growth <= 10, "bw_raise_growth", self.bw_raise_growth, "must be in [1, 10]")
        check(
            isinstance(self.bw_raise_hold, int) and 0 <= self.bw_raise_hold <= 100,
            "bw_raise_hold",
            self.bw_raise_hold,
            "must be an integer in 0..100",
        )
        check(0 < self.bw_lower_max < 1, "bw_lower_max", self.bw_lower_max, "must be in (0, 1)")
        check(
            isinstance(self.bw_probe_every, int) and 0 <= self.bw_probe_every <= 1000,
            "bw_probe_every",
            self.bw_probe_every,
            "must be an integer in 0..1000 (0: no pacing)",
        )
        check(
            isinstance(self.bw_probe_every_max, int)
            and self.bw_probe_every <= self.bw_probe_every_max <= 10_000,
            "bw_probe_every_max",
            self.bw_probe_every_max,
            "must be an integer in bw_probe_every..10000",
        )
        check(1 < self.bw_probe_gain <= 10, "bw_probe_gain", self.bw_probe_gain, "must be in (1, 10]")
        check(0 <= self.bw_fit_window <= 64, "bw_fit_window", self.bw_fit_window, "must be in [0, 64]")
        check(
            0 <= self.bw_raise_min_utilisation <= 1,
            "bw_raise_min_utilisation",
            self.bw_raise_min_utilisation,
            "must be in [0, 1]",
        )
        check(0 <= self.goodput_floor <= 1, "goodput_floor", self.goodput_floor, "must be in [0, 1]")
        check(self.goodput_ceiling >= 1, "goodput_ceiling", self.goodput_ceiling, "must be >= 1")
        check(self.goodput_max_age_s > 0, "goodput_max_age_s", self.goodput_max_age_s, "must be > 0")
        check(0 <= self.link_rate_floor <= 1, "link_rate_floor", self.link_rate_floor, "must be in [0, 1]")
        check(
            0 < self.link_rate_min_busy_s <= 60,
            "link_rate_min_busy_s",
            self.link_rate_min_busy_s,
            "must be in (0, 60] s",
        )
        check(
            0 < self.link_rate_max_age_s <= 3600,
            "link_rate_max_age_s",
            self.link_rate_max_age_s,
            "must be in (0, 3600] s",
        )
        check(
            0 < self.link_delivery_min_s <= 60,
            "link_delivery_min_s",
            self.link_delivery_min_s,
            "must be in (0, 60] s",
        )
        check(
            0 < self.link_delivery_max_age_s <= 3600,
            "link_delivery_max_age_s",
            self.link_delivery_max_age_s,
            "must be in (0, 3600] s",
        )
        check(
            isinstance(self.link_delivery_min_samples, int) and 1 <= self.link_delivery_min_samples <= 1000,
            "link_delivery_min_samples",
            self.link_delivery_min_samples,
            "must be an integer in 1..1000",
        )
        check(
            0 < self.link_paced_share <= 10,
            "link_paced_share",
            self.link_paced_share,
            "must be in (0, 10] (above 1: never)",
        )
        check(
            0 <= self.link_probe_max_age_s <= 3600,
            "link_probe_max_age_s",
            self.link_probe_max_age_s,
            "must be in [0, 3600] s",
        )
        check(
            0 < self.link_rx_max_age_s <= 3600,
            "link_rx_max_age_s",
            self.link_rx_max_age_s,
            "must be in (0, 3600] s",
        )
        check(
            self.link_rx_filter in ("median", "max"),
            "link_rx_filter",
            self.link_rx_filter,
            "must be 'median' or 'max'",
        )
        check(
            isinstance(self.latency_window, int) and 0 <= self.latency_window <= 256,
            "latency_window",
            self.latency_window,
            "must be an integer in 0..256",
        )
        check(
            0 <= self.latency_min_byte_share <= 10,
            "latency_min_byte_share",
            self.latency_min_byte_share,
            "must be in [0, 10]",
        )
        check(
            self.standin_critical_batch > 0,
            "standin_critical_batch",
            self.standin_critical_batch,
            "must be > 0",
        )
        check(self.standin_batch_ref > 0, "standin_batch_ref", self.standin_batch_ref, "must be > 0")
        check(
            0 <= self.standin_density_exponent <= 4,
            "standin_density_exponent",
            self.standin_density_exponent,
            "must be in [0, 4]",
        )
        check(
            0 <= self.standin_density_coef <= 10,
            "standin_density_coef",
            self.standin_density_coef,
            "must be in [0, 10]",
        )
        check(self.tta_lambda >= 0, "tta_lambda", self.tta_lambda, "must be >= 0")
        check(self.min_batch <= self.max_batch, "max_batch", self.max_batch, "must be >= min_batch")
        check(
            isinstance(self.min_total_batch, int) and self.min_total_batch >= 1,
            "min_total_batch",
            self.min_total_batch,
            "must be an integer >= 1",
        )
        check(
            isinstance(self.max_total_batch, int) and self.max_total_batch >= self.min_total_batch,
            "max_total_batch",
            self.max_total_batch,
            "must be an integer >= min_total_batch",
        )
        check(0 <= self.r_min <= self.r_max < 1, "r_max", self.r_max, "need 0 <= r_min <= r_max < 1")
        check(self.bytes_per_element > 0, "bytes_per_element", self.bytes_per_element, "must be > 0")
        check(
            self.eq6_iteration_time in ("each_rank", "slowest_rank"),
            "eq6_iteration_time",
            self.eq6_iteration_time,
            "one of 'each_rank', 'slowest_rank'",
        )
        check(
            self.eq6_with_latency in ("impose", "price"),
            "eq6_with_latency",
            self.eq6_with_latency,
            "one of 'impose', 'price'",
        )
        check(
            1.0 <= self.exchange_serial_payloads <= 1024.0,
            "exchange_serial_payloads",
            self.exchange_serial_payloads,
            "must be in [1, 1024]",
        )
        check(
            isinstance(self.search_batch_candidates, int) and self.search_batch_candidates >= 2,
            "search_batch_candidates",
            self.search_batch_candidates,
            "must be an integer >= 2",
        )
        check(
            isinstance(self.search_r_candidates, int) and self.search_r_candidates >= 2,
            "search_r_candidates",
            self.search_r_candidates,
            "must be an integer >= 2",
        )
        check(
            isinstance(self.search_polish_max_ranks, int) and self.search_polish_max_ranks >= 0,
            "search_polish_max_ranks",
            self.search_polish_max_ranks,
            "must be an integer >= 0",
        )
        check(
            0 <= self.first_plan_settle < 1,
            "first_plan_settle",
            self.first_plan_settle,
            "must be in [0, 1)",
        )
        check(self.replan_period_s > 0, "replan_period_s", self.replan_period_s, "must be > 0")
        check(
            0 < self.replan_bandwidth_change < 1,
            "replan_bandwidth_change",
            self.replan_bandwidth_change,
            "must be in (0, 1)",
        )
        check(
            0 < self.replan_latency_change < 10,
            "replan_latency_change",
            self.replan_latency_change,
            "must be in (0, 10)",
        )
        check(
            0 <= self.replan_min_interval_s <= self.replan_period_s,
            "replan_min_interval_s",
            self.replan_min_interval_s,
            "must be in [0, replan_period_s]",
        )
        check(
            isinstance(self.warmup_iterations, int) and self.warmup_iterations >= 0,
            "warmup_iterations",
            self.warmup_iterations,
            "must be an integer >= 0",
        )
        check(
            0 < self.warmup_start_density <= 1,
            "warmup_start_density",
            self.warmup_start_density,
            "must be in (0, 1]",
        )
        check(
            0 <= self.staleness_min_gain < 1,
            "staleness_min_gain",
            self.staleness_min_gain,
            "must be in [0, 1)",
        )
        check(
            -0.5 <= self.staleness_penalty_default <= 10,
            "staleness_penalty_default",
            self.staleness_penalty_default,
            "must be in [-0.5, 10]",
        )

    @property
    def density_range(self) -> tuple[float, float]:
        """(smallest, largest) density the search may choose."""
        return 1.0 - self.r_max, 1.0 - self.r_min
