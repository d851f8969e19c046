"""The scheduler's decision logic in one sans-IO object: telemetry and "time is now" in, decisions out.

StellaTrain's optimisation cycle (§4.1, Fig. 7): ① telemetry from every GPU → ② fit each GPU's throughput
model (Eq. 2) → ③ update the bandwidth estimate from the idle rate → ④ search (r, x⃗) minimising Eq. 1 under
Eq. 6 → ⑤ apply from a designated iteration. :class:`SchedulerPolicy` composes the pieces of this package:

* :class:`~scheduler.control.throughput.ThroughputModel` per rank (②);
* :class:`~scheduler.control.bandwidth.BandwidthEstimator` (③), cross-checked with gateway goodput,
  lifted at every decide tick to the slowest link's measured rate while sending, and set to the slowest
  backlogged link's delivery rate when one queued recently
  (:class:`~scheduler.control.link_rate.LinkRates`);
* :func:`~scheduler.control.search.search` (④), run when :class:`~scheduler.control.replan.ReplanPolicy`
  says so;
* :class:`~scheduler.control.warmup.DensityWarmup` and :func:`~scheduler.control.staleness.choose_staleness`
  on top of the searched plan.

How the daemon drives it::

    policy.observe_rank(rank, iteration=i, batch_size=x, compute_s=c, iteration_s=t, now=now)
    policy.observe_goodput(bps, now=now)          # from the gateways, when they report
    policy.observe_link(link, bytes_sent=b, busy_s=s, now=now)   # per link, cumulative counters
    policy.observe_link_backlog(link, nbytes=b, seconds=s, now=now)  # per link, while backlogged
    d = policy.decide(now)                        # a Decision, or None: keep the current one
    if d is not None:
        d = d.effective_from(n)                   # the daemon picks the common iteration n
        announce(d); policy.confirm(d)

Why ``confirm``: the idle rate means something only together with the payload that caused it, and a new
plan reaches the trainers some iterations after it was decided. The policy interprets telemetry of iteration
``i`` with the decision in effect at ``i`` (the confirmed one with the largest effective iteration ≤ i),
and while a decision it made is not yet in effect it does not move the bandwidth estimate by the idle
rule — telemetry of the old plan would otherwise raise (or cut) the estimate again for a change already on
its way. The link-rate floor is applied at every tick regardless: bytes over busy time describe the link,
not the plan, so it needs no plan in force.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from scheduler.control.bandwidth import BandwidthEstimator, BandwidthStep
from scheduler.control.byte_cost import ByteCost, ByteCostFit
from scheduler.control.config import SchedulerConfig
from scheduler.control.convergence import ConvergenceModel
from scheduler.control.decision import Decision, DecisionReason
from scheduler.control.latency import ExchangeLatency
from scheduler.control.link_rate import LinkRates
from scheduler.control.replan import ReplanPolicy
from scheduler.control.search import Plan, search
from scheduler.control.staleness import choose_staleness
from scheduler.control.throughput import ThroughputFit, ThroughputModel
from scheduler.control.warmup import DensityWarmup
from wanrt.errors import ConfigError, RemoteProtocolError

__all__ = ["MAX_PENDING_ITERATIONS", "SchedulerPolicy"]

#: with the exchange latency on, the first plan waits for this many telemetry windows of the running plan
FIRST_PLAN_WINDOWS = 3
#: ... and for up to this many windows until as many of them measured the latency (the exchange paced
#: them): one start-up iteration of 830 ms under load set L, and the first plan sent 0.23 of the gradient
FIRST_PLAN_MAX_WINDOWS = 8

#: ... and, with ``first_plan_settle``, for up to this many windows until the estimate settles (a link whose
#: estimate never stops moving still gets a plan, 6 s in at the demo's 0.5 s ticks)
FIRST_PLAN_SETTLE_MAX_WINDOWS = 12

#: iterations of telemetry kept between two decisions; a daemon that stops calling ``decide`` must not
#: make the policy grow without bound (the oldest iterations are dropped first)
MAX_PENDING_ITERATIONS = 4096


@dataclass(frozen=True, slots=True)
class _InEffect:
    """What the trainers ran from ``iteration`` on: enough to turn idle into bytes and exchange time."""

    iteration: int
    density: float
    staleness: int


class SchedulerPolicy:
    """StellaTrain's controller (§4.1) as a plain object; see the module docstring for the protocol."""

    def __init__(
        self,
        config: SchedulerConfig,
        convergence: ConvergenceModel,
        *,
        n_params: int,
        ranks: Sequence[int],
        initial_density: float | None = None,
        initial_staleness: int = 1,
    ) -> None:
        """``initial_density``/``initial_staleness``: what the job runs before the first decision (lets
        the first telemetry move the bandwidth estimate; None: wait for the first confirmed decision)."""
        if n_params < 1:
            raise ConfigError("model must have parameters", key="n_params", value=n_params)
        if not ranks or len(set(ranks)) != len(ranks):
            raise ConfigError("need at least one rank, each once", key="ranks", value=tuple(ranks))
        if initial_density is not None and not 0 < initial_density <= 1:
            raise ConfigError(
                "initial density must be in (0, 1]", key="initial_density", value=initial_density
            )
        self.cfg = config
        self.convergence = convergence
        self.n_params = int(n_params)
        self.ranks = tuple(sorted(ranks))
        self.bandwidth = BandwidthEstimator(config)
        self.links = LinkRates(config)
        self.latency = ExchangeLatency(config.latency_window)
        #: L as the search models it, net of all ``exchange_serial_payloads`` payloads' time (the
        #: estimator's ``latency`` is net of one, the bytes it judges B by): the same exchanges, so the
        #: search's ``L + h · bytes / B`` predicts at the running payload what was measured (with h = 1 the
        #: two are the same median: one object)
        self.search_latency = (
            self.latency if config.exchange_serial_payloads == 1.0 else ExchangeLatency(config.latency_window)
        )
        self.replan = ReplanPolicy(config)
        self.warmup = DensityWarmup(config)
        self._models = {
            r: ThroughputModel(window=config.throughput_window, min_batches=config.throughput_min_batches)
            for r in self.ranks
        }
        self._byte_costs = {r: ByteCost(window=config.throughput_window) for r in self.ranks}
        self._in_effect: list[_InEffect] = []
        if initial_density is not None:
            self._in_effect.append(_InEffect(0, float(initial_density), int(initial_staleness)))
        # telemetry since the last bandwidth update: iteration -> rank -> (compute_s, iteration_s)
        self._window: dict[int, dict[int, tuple[float, float]]] = {}
        self._last_iteration = -1
        self._awaiting: Decision | None = None
        self._plan: Plan | None = None
        self._decision: Decision | None = None
        self.last_bandwidth_step: BandwidthStep | None = None
        #: what the estimator was last fed (the critical rank's medians), for the decisions file
        self.last_observation: dict[str, float] | None = None
        self._fed = 0  # windows fed to the estimator
        self._delivery_seen = False  # a link has reported its delivery while backlogged
        self._censored = True  # no link's delivery rate was measured at this tick (paced probing)
        #: the bandwidth estimate at the previous decide tick and its relative move since (first_plan_settle)
        self._prev_estimate: float | None = None
        self._estimate_move = math.inf

    # -- telemetry in --------------------------------------------------------------------------------------
    def observe_rank(
        self,
        rank: int,
        *,
        iteration: int,
        batch_size: int,
        compute_s: float,
        iteration_s: float,
        now: float,
        byte_s: float | None = None,
    ) -> None:
        """One rank's iteration: its batch, compute time and wall time (idle = 1 − compute/wall).

        ``byte_s``: the part of ``compute_s`` that depends on the payload (compressing, applying the sparse
        update), if the trainer measures it apart. Then Eq. 2's throughput is fitted on the rest and the
        payload's cost on the plan's payload (:mod:`scheduler.control.byte_cost`)."""
        if rank not in self._models:
            raise RemoteProtocolError(f"telemetry from unknown rank {rank}", value=rank)
        vals = (compute_s, iteration_s, now)
        if not all(math.isfinite(v) for v in vals) or compute_s <= 0 or iteration_s <= 0 or iteration < 0:
            raise RemoteProtocolError("rank telemetry must be finite with positive times", value=vals)
        model_s = compute_s
        if byte_s is not None:
            if not (math.isfinite(byte_s) and byte_s >= 0):
                raise RemoteProtocolError("byte time must be finite and >= 0", value=byte_s)
            byte_s = min(byte_s, compute_s)
            eff = self._effect_at(iteration)
            if eff is not None:
                payload = eff.density * self.n_params * self.cfg.bytes_per_element
                self._byte_costs[rank].observe(payload, byte_s)
                model_s = max(compute_s - byte_s, 1e-3 * compute_s)
        self._models[rank].observe(batch_size, batch_size / model_s)
        self._window.setdefault(iteration, {})[rank] = (compute_s, max(iteration_s, compute_s))
        if len(self._window) > MAX_PENDING_ITERATIONS:
            del self._window[min(self._window)]
        self._last_iteration = max(self._last_iteration, iteration)

    def observe_goodput(self, goodput_bps: float, now: float) -> None:
        """The gateways' measured WAN goodput, bit/s (the estimator's cross-check)."""
        self.bandwidth.observe_goodput(goodput_bps, now)

    def observe_link(
        self, link: str, *, bytes_sent: float, busy_s: float, now: float, peak_bps: float | None = None
    ) -> float | None:
        """A WAN link's cumulative counters: bytes sent, and seconds it had bytes in flight (and its
        fastest recent message, bit/s). Returns the link's new rate while sending (bit/s) when this report
        completed a measurement window."""
        return self.links.observe(link, bytes_sent=bytes_sent, busy_s=busy_s, now=now, peak_bps=peak_bps)

    def observe_link_backlog(self, link: str, *, nbytes: float, seconds: float, now: float) -> float | None:
        """A WAN link's cumulative delivery while backlogged (bytes, seconds); returns the link's new
        delivery rate (bit/s) when this report completed a measurement window."""
        return self.links.observe_backlog(link, nbytes=nbytes, seconds=seconds, now=now)

    def observe_link_rx(
        self,
        link: str,
        *,
        nbytes: float,
        seconds: float,
        now: float,
        n: float | None = None,
        fast: float | None = None,
    ) -> float | None:
        """A WAN link's cumulative tail dispersion at its receiver (bytes, seconds, tails measured and
        too fast to measure; ``link`` is ``sender>receiver``); returns the link's new rate (bit/s) when
        this report completed a window."""
        return self.links.observe_rx(link, nbytes=nbytes, seconds=seconds, now=now, n=n, fast=fast)

    def observe_link_probe(self, link: str, *, nbytes: float, seconds: float, now: float) -> float | None:
        """A WAN link's cumulative timed-probe-train tails at its receiver (bytes, seconds; ``link`` is
        ``sender>receiver``); returns the link's new train rate (bit/s) when this report held a new train."""
        return self.links.observe_probe(link, nbytes=nbytes, seconds=seconds, now=now)

    def confirm(self, decision: Decision) -> None:
        """The daemon announced ``decision`` (with its effective iteration set)."""
        if decision.effective_iteration is None:
            raise ConfigError(
                "confirm a decision after setting its effective iteration", key="effective_iteration"
            )
        eff = _InEffect(decision.effective_iteration, decision.density, decision.staleness)
        self._in_effect = [e for e in self._in_effect if e.iteration < eff.iteration] + [eff]
        if self._awaiting is not None and decision.decided_at >= self._awaiting.decided_at:
            self._awaiting = decision

    # -- state out -----------------------------------------------------------------------------------------
    @property
    def bandwidth_estimate_bps(self) -> float:
        return self.bandwidth.estimate_bps

    @property
    def last_decision(self) -> Decision | None:
        return self._decision

    @property
    def last_plan(self) -> Plan | None:
        return self._plan

    def fits(self) -> dict[int, ThroughputFit | None]:
        return {r: m.fit() for r, m in self._models.items()}

    def byte_costs(self) -> dict[int, ByteCostFit | None]:
        """Per rank, the payload's measured CPU time (None: the trainer does not measure it apart)."""
        return {r: b.fit() for r, b in self._byte_costs.items()}

    # -- decisions out -------------------------------------------------------------------------------------
    def _effect_at(self, iteration: int) -> _InEffect | None:
        cur = None
        for e in self._in_effect:
            if e.iteration <= iteration:
                cur = e
        return cur

    def _update_bandwidth(self, now: float, *, probing: bool = False) -> None:
        """Feed the estimator one aggregate of the telemetry gathered since the last decision.

        While a new plan is on its way, the running plan's telemetry may still *lower* the estimate (a
        drop must not wait the announce margin plus the slow iterations the drop itself causes: in the
        real daemons 15 s at 30 Mbit/s), never raise it — unless ``probing``: the links report their
        delivery while backlogged and none queued lately, so every link carries the running plan with
        room to spare, and a raise that overshoots is set back by the first window in which a link
        queues (under load a plan took ~6 s to come into force, and the probe after a 30 → 100 Mbit/s
        step waited for each one: 0.64 off at the 10th tick)."""
        lower_only = False
        if self._awaiting is not None:
            eff = self._awaiting.effective_iteration
            if eff is None or self._last_iteration < eff:
                old = {i: v for i, v in self._window.items() if eff is None or i < eff}
                self._window = {i: v for i, v in self._window.items() if eff is not None and i >= eff}
                self._feed(old, now, lower_only=not probing)
                return
            self._awaiting = None
            self._window = {i: v for i, v in self._window.items() if i >= eff}
        window, self._window = self._window, {}
        self._feed(window, now, lower_only=lower_only)

    def _feed(
        self, window: dict[int, dict[int, tuple[float, float]]], now: float, *, lower_only: bool
    ) -> None:
        if not window:
            return
        current = self._effect_at(max(window))
        if current is None:
            return
        rows = [v for i, v in window.items() if i >= current.iteration]
        complete = [v for v in rows if len(v) == len(self.ranks)]
        rows = complete or rows  # iterations every rank reported, if there are any
        if not rows:
            return
        # the critical rank of an iteration is the one that computed longest: its idle is the exchange's
        crit = [max(v.values(), key=lambda ct: ct[0]) for v in rows]
        compute = float(np.median([c for c, _ in crit]))
        wall = float(np.median([t for _, t in crit]))
        idle = float(np.median([1.0 - c / t for c, t in crit]))
        payload = current.density * self.n_params * self.cfg.bytes_per_element
        exposed = idle >= self.cfg.bw_idle_threshold
        overlapped = current.staleness >= 1
        # the exchange took this long when it paced the iteration: an upper bound on its latency. (When it
        # hid, compute bounds it too, but the search sizes compute to the latency, and L then ratchets up
        # with the batch: 204 → 296 samples in 100 ticks of the toy loop)
        comm = wall if overlapped else idle * wall
        # net of the bytes' time at the estimate: with a 42 MB model the byte time is most of the exchange,
        # and L (a typical exchange) would hold it, reading a drop's rate as only its excess
        byte_s = 8.0 * payload / self.bandwidth.estimate_bps
        net = max(0.0, comm - byte_s)
        latency = self.latency.observe(net) if exposed else self.latency.latency_s
        if exposed and self.search_latency is not self.latency:
            self.search_latency.observe(max(0.0, comm - self.cfg.exchange_serial_payloads * byte_s))
        self._fed += 1
        self.last_observation = {
            "compute_s": compute,
            "iteration_s": wall,
            "idle": idle,
            "payload_bytes": payload,
            "iterations": float(len(rows)),
            "latency_s": latency,
            "search_latency_s": self.search_latency.latency_s,
        }
        # what the search was told (the decisions file is the only place a run shows it)
        fitted = [b for b in self.byte_costs().values() if b is not None]
        if fitted:
            self.last_observation["byte_fixed_s"] = max(b.fixed_s for b in fitted)
            self.last_observation["byte_s_per_mb"] = 1e6 * max(b.per_byte_s for b in fitted)
        if self._plan is not None:
            self.last_observation["plan_compute_s"] = self._plan.compute_time_s
            self.last_observation["plan_exchange_s"] = self._plan.exchange_time_s
            self.last_observation["plan_feasible"] = float(self._plan.feasible)
        for link, (nbytes, busy, peak) in self.links.windows().items():
            self.last_observation[f"link.{link}.bytes"] = nbytes
            self.last_observation[f"link.{link}.busy_s"] = busy
            self.last_observation[f"link.{link}.peak_bps"] = peak
        for link, (nbytes, busy, _) in self.links.delivery_windows().items():
            self.last_observation[f"link.{link}.backlog_bytes"] = nbytes
            self.last_observation[f"link.{link}.backlog_s"] = busy
        for link, (nbytes, secs, rate) in self.links.rx_windows().items():
            self.last_observation[f"link.{link}.rx_bytes"] = nbytes
            self.last_observation[f"link.{link}.rx_s"] = secs
            self.last_observation[f"link.{link}.rx_bps"] = rate
        step = self.bandwidth.update(
            idle=idle,
            iteration_s=wall,
            compute_s=compute,
            bytes_per_iteration=payload,
            overlapped=overlapped,
            now=now,
            lower_only=lower_only,
            latency_s=latency,
            censored=self._censored,
        )
        if not (lower_only and step.kind == "hold"):
            self.last_bandwidth_step = step

    def _apply_link_floor(self, floor: float | None, now: float) -> None:
        if self.cfg.link_rate_floor <= 0:
            return
        if floor is not None:
            step = self.bandwidth.apply_floor(floor, now)
            if step is not None:
                self.last_bandwidth_step = step

    def decide(self, now: float) -> Decision | None:
        """A new decision if one is due (initial, bandwidth change, period, warm-up stage), else None."""
        fits = self.fits()
        if any(f is None for f in fits.values()):
            return None  # a rank without telemetry cannot be given a batch size yet
        floor = self.links.floor_bps(now)
        if floor is not None:
            self.bandwidth.observe_link_rate(floor, now)
        delivery = self.links.delivery_bps(now) if self.cfg.link_delivery else None
        self._delivery_seen = self._delivery_seen or delivery is not None
        self._censored = delivery is None
        self._update_bandwidth(now, probing=delivery is None and self._delivery_seen)
        self._apply_link_floor(floor, now)
        if delivery is not None:
            step = self.bandwidth.apply_delivery(delivery, now)
            if step is not None:
                self.last_bandwidth_step = step
        est = self.bandwidth.estimate_bps
        if self._prev_estimate is not None:
            self._estimate_move = abs(est / self._prev_estimate - 1.0)
        self._prev_estimate = est
        waiting = (
            self._fed < FIRST_PLAN_WINDOWS
            or (self.latency.count < FIRST_PLAN_WINDOWS and self._fed < FIRST_PLAN_MAX_WINDOWS)
            or (self._unsettled() and self._fed < FIRST_PLAN_SETTLE_MAX_WINDOWS)
        )
        if self.latency.enabled and self._plan is None and self._in_effect and waiting:
            # the first plan waits for a few windows of the running plan: priced without the latency it is
            # the paper's Eq. 6 plan (density 0.35 in the demo, 125–200 ms per iteration for 40 iterations),
            # and from one iteration per site the Eq. 2 fits split 97 samples per rank as 1/48/48 for good.
            # Until L is measured it waits longer: the first iterations are slow (connections, first
            # rounds: compute-bound at 60-90 ms under load), and a plan made then was the paper's. And
            # with first_plan_settle until the estimate stopped moving (a start-up dip, config.py)
            return None
        bw = self.bandwidth.estimate_bps
        lat = self.search_latency.latency_s
        reason: DecisionReason | None = self.replan.reason(now, bw, lat)
        next_iter = self._last_iteration + 1
        plan = self._plan
        if reason is not None or plan is None:
            plan = search(
                [f for f in fits.values() if f is not None],
                bandwidth_bps=bw,
                n_params=self.n_params,
                convergence=self.convergence,
                config=self.cfg,
                byte_costs=list(self.byte_costs().values()),
                latency_s=lat,
            )
            self.replan.planned(now, bw, lat)
            reason = reason or "initial"
        density = self.warmup.density(next_iter, plan.density)
        if reason is None:
            last = self._decision
            if last is None or math.isclose(density, last.density, rel_tol=1e-9):
                return None
            reason = "warmup_stage"
        self._plan = plan
        payload = density * self.n_params * self.cfg.bytes_per_element
        exchange = lat + self.cfg.exchange_serial_payloads * payload * 8.0 / bw
        choice = choose_staleness(
            compute_s=plan.compute_time_s,
            exchange_s=exchange,
            g=plan.g,
            staleness_penalty=self.convergence.staleness_penalty,
            config=self.cfg,
        )
        decision = Decision(
            density=density,
            target_density=plan.density,
            ranks=self.ranks,
            batch_sizes=plan.batches,
            staleness=choice.staleness,
            decided_at=now,
            reason=reason,
            bandwidth_bps=bw,
            predicted_compute_s=plan.compute_time_s,
            predicted_exchange_s=exchange,
        )
        if self._decision is not None and _same_config(decision, self._decision):
            return None  # nothing to announce: the new search agrees with what is running
        self._decision = decision
        self._awaiting = decision
        return decision

    def _unsettled(self) -> bool:
        """The estimate moved by ``first_plan_settle`` or more between the last two decide ticks."""
        return self.cfg.first_plan_settle > 0 and self._estimate_move >= self.cfg.first_plan_settle


def _same_config(a: Decision, b: Decision) -> bool:
    return (
        math.isclose(a.density, b.density, rel_tol=1e-6)
        and a.batch_sizes == b.batch_sizes
        and a.staleness == b.staleness
    )
