"""Step ③ of the optimisation cycle (StellaTrain §4.1): the WAN bandwidth estimate B from GPU idle rates.

The paper's loop: "When the idle rate of the GPU is less than 5 %, the controller increases the estimated
bandwidth [...]. Otherwise, the controller reduces the estimated bandwidth." The scheduler sizes the payload
to the estimate (Eq. 6), so an over-estimate shows up as the GPUs waiting for the exchange (idle) and an
under-estimate as no idle at all. The paper gives no step sizes; ours, all in :class:`SchedulerConfig`:

**Lower (idle ≥ ``bw_idle_threshold``).** The link was the bottleneck, so the iteration measured the
exchange: with staleness ≥ 1 the exchange overlaps compute and the iteration *is* the exchange
(``comm = iteration time``); with staleness 0 they run one after the other and the wait is the exchange
(``comm = idle · iteration time``). The link therefore carried ``R = bytes / comm``, and the estimate is set
to ``R / (1 − bw_target_idle)``, the rate at which the next plan idles just ``bw_target_idle`` (a little
under the threshold: the loop settles where the paper wants it, communication just hidden). A drop to a
third of the rate is found in one decision. The cut is bounded by ``bw_lower_max`` per decision. Without
byte counts (``bytes_per_iteration`` None) the payload is assumed sized to the estimate, so
``R = B̂ · (1 − idle)``.

**Raise (idle < threshold).** The exchange hid behind compute: the link carries *at least* what was sent;
how much more is unknown, so the estimate is probed upwards: ``B̂ ← B̂ · (1 + step)``, the step starting at
``bw_raise_initial`` after a lowering and multiplied by ``bw_raise_growth`` on each consecutive raise (up to
``bw_raise_max``) — a slow-start that finds 30 → 100 Mbit/s in about four decisions. After a lowering the
estimate holds for ``bw_raise_hold`` low-idle decisions before probing again, so in steady state it sits at
``R / (1 − bw_target_idle)`` (2.6 % above the link) and probes +10 % once every few decisions, each failed
probe being undone by the next lowering. A raise needs evidence: if
the payload used less than ``bw_raise_min_utilisation`` of the estimate during compute, a low idle says
nothing about the estimate (a small payload hides behind any link), and the estimate holds.

**Cross-check with the gateways' goodput** (bytes delivered over the time spent sending them, bit/s): the
estimate never sits below ``goodput_floor`` × goodput (the link demonstrably carried that), and while idle
is high — the link saturated, so goodput *is* its capacity — never above ``goodput_ceiling`` × goodput (or
× the link rate while sending, if that is larger: see :meth:`BandwidthEstimator._ceiling_basis`).
Goodput older than ``goodput_max_age_s`` is ignored. Finally ``[bw_min_bps, bw_max_bps]`` bound everything.

**Link-rate floor** (:mod:`scheduler.control.link_rate`, ours): the slowest link's rate *while sending*
(bytes over the gateways' busy time) is what the links demonstrably carried, whatever the payload and
whether or not the exchange hid behind compute. :meth:`BandwidthEstimator.apply_floor` lifts the estimate
to ``link_rate_floor`` × that rate at every decide tick — also while a new plan is on its way, since it
does not depend on which plan ran. It is what finds a *rise* at once: the idle rule's slow-start needs a
plan in force per raise (StellaTrain §6's conservative direction is kept: the floor never exceeds what was
carried, round trips included).

**Delivery rate** (ours, :mod:`scheduler.control.link_rate`): when a link delivered bytes while its
sender had data queued within the last
``link_delivery_max_age_s``, the slowest such link's delivery rate while backlogged *sets* the estimate
(:meth:`BandwidthEstimator.apply_delivery`), after the rules here: it measures B at the bottleneck, with
round trips, CPU and waits left out, which the idle rate cannot when the exchange hides behind compute or
a latency swamps its bytes. The gateways report the counters from their own send/ack path
(gateways/sending/link_times.py: each large message's span less the link's round trip).

**Latency** (ours, :mod:`scheduler.control.latency`; ``latency_s`` = 0 is the paper's rule): an exchange
takes ``L + bytes / B``. When it paced the iteration (idle ≥ threshold), only ``comm − L`` is the bytes'
time, so the idle is judged by it: the bytes took longer than ``bytes / B̂`` (by more than the threshold)
→ lower to ``bytes / (comm − L)``; no longer → the link kept up with the estimate, a raise as for low
idle; and if the bytes' predicted time is under ``latency_min_byte_share`` of L, hold — they are lost in
the latency's jitter, and a latency-bound iteration says nothing about B. Without this, the 40 ms round
trip of the demo's tree read as a 2–12 Mbit/s link on 20–100 Mbit/s links (docs/demo.md).

**Paced probing** (ours, BBR's ProbeBW; ``bw_probe_every``, ``bw_probe_gain``): once a delivery rate has
measured the link, a raise while no link is measured (``censored``) is a probe — the estimate times the gain,
held for ``bw_probe_every`` ticks until the raised plan's samples can return. A probe is only ever kept by a
measurement (:meth:`BandwidthEstimator.apply_delivery`); one that nothing measured is undone and the next
waits twice as long. What measures a link the plan's payload cannot is the gateways' timed probe trains
(gateways/sending/probe_trains.py), which reach :meth:`apply_delivery` through the links' rates.

Sans-IO: observations carry ``now``; nothing here reads a clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from scheduler.control.config import SchedulerConfig
from wanrt.errors import RemoteProtocolError

__all__ = ["BandwidthEstimator", "BandwidthStep"]

StepKind = Literal["raise", "lower", "hold"]


@dataclass(frozen=True, slots=True)
class BandwidthStep:
    """What one update did, for logs, metrics and tests."""

    kind: StepKind
    before_bps: float
    after_bps: float
    #: the rate the last exchange demonstrably achieved (lower) or needed (raise), bit/s; None if unknown
    evidence_bps: float | None
    #: which bound moved the estimate last: "", "goodput_floor", "goodput_ceiling", "min", "max", or
    #: "link_rate" (a lift by :meth:`BandwidthEstimator.apply_floor`), "link_delivery"
    #: (:meth:`BandwidthEstimator.apply_delivery`)
    clamped_by: str


class BandwidthEstimator:
    """The idle-driven feedback loop of §4.1 with the step rule and cross-checks of the module docstring."""

    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.cfg = config if config is not None else SchedulerConfig()
        self._estimate = self.cfg.bw_initial_bps
        self._raise_step = self.cfg.bw_raise_initial
        self._hold = 0
        self._goodput: tuple[float, float] | None = None  # (bps, time)
        self._link_rate: tuple[float, float] | None = None  # (bps, time): the slowest link while sending
        self._points: list[tuple[float, float]] = []  # (bytes per iteration, exchange s) while lowering
        # paced probing (``bw_probe_every``): the links' last delivery rate, ticks since the last probe,
        # the current spacing, and the measured rate the outstanding probe started from
        self._measured: float | None = None
        self._since_probe = 0
        self._probe_every = self.cfg.bw_probe_every
        self._probe_from: float | None = None

    @property
    def estimate_bps(self) -> float:
        return self._estimate

    @property
    def raise_step(self) -> float:
        """The fraction the next raise would add."""
        return self._raise_step

    def observe_goodput(self, goodput_bps: float, now: float) -> None:
        """The gateways' measured goodput (bytes delivered per second of sending), bit/s."""
        if not (math.isfinite(goodput_bps) and goodput_bps > 0 and math.isfinite(now)):
            raise RemoteProtocolError("goodput must be finite and > 0", value=goodput_bps)
        self._goodput = (float(goodput_bps), float(now))

    def observe_link_rate(self, rate_bps: float, now: float) -> None:
        """The slowest link's measured rate while sending, bit/s (:mod:`scheduler.control.link_rate`)."""
        if not (math.isfinite(rate_bps) and rate_bps > 0 and math.isfinite(now)):
            raise RemoteProtocolError("link rate must be finite and > 0", value=rate_bps)
        self._link_rate = (float(rate_bps), float(now))

    def _fresh_goodput(self, now: float) -> float | None:
        if self._goodput is None or now - self._goodput[1] > self.cfg.goodput_max_age_s:
            return None
        return self._goodput[0]

    def _ceiling_basis(self, now: float) -> float | None:
        """What the saturated link carried: the goodput, or the link rate while sending if larger. Goodput
        (bytes over wall time) reads the capacity only if the link never paused; with acknowledgement round
        trips and rounds waiting for their inputs it does pause, and at start-up the wall time holds no
        traffic at all (the quick demo's first lowering went to 0.1 Mbit/s on a 100 Mbit/s link)."""
        gp = self._fresh_goodput(now)
        lr = self._link_rate
        if lr is not None and now - lr[1] <= self.cfg.link_rate_max_age_s:
            gp = lr[0] if gp is None else max(gp, lr[0])
        return gp

    def apply_floor(self, floor_bps: float, now: float) -> BandwidthStep | None:
        """Lift the estimate to ``link_rate_floor × floor_bps`` (the slowest link's measured rate while
        sending); None if it already is at least that. A lift ends a slow-start and its hold: the estimate
        is now a measurement, and the idle rule probes onwards from it."""
        if not (math.isfinite(floor_bps) and floor_bps > 0 and math.isfinite(now)):
            raise RemoteProtocolError("link rate must be finite and > 0", value=floor_bps)
        target = min(self.cfg.link_rate_floor * floor_bps, self.cfg.bw_max_bps)
        before = self._estimate
        if target <= before:
            return None
        self._estimate = target
        self._raise_step = self.cfg.bw_raise_initial
        self._hold = 0
        self._points.clear()
        return BandwidthStep("raise", before, target, floor_bps, "link_rate")

    def apply_delivery(self, rate_bps: float, now: float) -> BandwidthStep | None:
        """Set the estimate to the links' delivery rate while backlogged (the slowest backlogged link's
        bytes over its backlog time, :meth:`LinkRates.delivery_bps`); None if it is there already.

        Unlike the floors this moves both ways: it measures B itself, at the bottleneck, with the round
        trips, the peers' CPU and the waits for inputs left out — the evidence the idle rule lacks when
        the exchange hides behind compute or its fixed latency swamps the bytes (docs/scheduler.md). The
        idle rule's probing restarts from it."""
        if not (math.isfinite(rate_bps) and rate_bps > 0 and math.isfinite(now)):
            raise RemoteProtocolError("delivery rate must be finite and > 0", value=rate_bps)
        target = min(max(rate_bps, self.cfg.bw_min_bps), self.cfg.bw_max_bps)
        self._measured_probe(target)
        before = self._estimate
        if math.isclose(target, before, rel_tol=1e-9):
            return None
        self._estimate = target
        self._raise_step = self.cfg.bw_raise_initial
        self._hold = 0
        self._points.clear()
        kind: StepKind = "raise" if target > before else "lower"
        return BandwidthStep(kind, before, target, rate_bps, "link_delivery")

    @property
    def probe_every(self) -> int:
        """Decide ticks the next paced probe waits for (``bw_probe_every`` doubled per failed probe)."""
        return self._probe_every

    def _measured_probe(self, rate: float) -> None:
        """A delivery measurement: judge the outstanding probe (the link showed less than half the probe's
        gain over the rate it started from: it failed, wait twice as long for the next), or notice the link
        moved (a quarter or more from the last measurement: probe at the base spacing again)."""
        cfg = self.cfg
        if self._probe_from is not None:
            failed = rate < self._probe_from * (1.0 + (cfg.bw_probe_gain - 1.0) / 2.0)
            self._probe_every = (
                min(2 * self._probe_every, cfg.bw_probe_every_max) if failed else cfg.bw_probe_every
            )
            self._probe_from = None
            self._since_probe = 0  # the next probe starts from this measurement
        elif self._measured is not None and abs(rate / self._measured - 1.0) > 0.25:
            self._probe_every = cfg.bw_probe_every
        self._measured = rate

    def _fit(self, nbytes: float, comm: float) -> float | None:
        """Seconds per byte of the exchange, from a least-squares line comm = a + slope·bytes over the recent
        lowering observations (None while they hold fewer than two payload sizes)."""
        window = self.cfg.bw_fit_window
        if window == 0:
            return None
        self._points.append((nbytes, comm))
        del self._points[:-window]
        xs = [b for b, _ in self._points]
        if max(xs) <= min(xs) * 1.05:
            return None  # one payload size: bytes and latency cannot be told apart
        n = len(xs)
        mx = sum(xs) / n
        my = sum(c for _, c in self._points) / n
        sxx = sum((x - mx) ** 2 for x in xs)
        sxy = sum((x - mx) * (c - my) for x, c in self._points)
        return sxy / sxx

    def update(
        self,
        *,
        idle: float,
        iteration_s: float,
        compute_s: float,
        bytes_per_iteration: float | None,
        overlapped: bool,
        now: float,
        lower_only: bool = False,
        latency_s: float = 0.0,
        censored: bool = True,
    ) -> BandwidthStep:
        """One decision's worth of telemetry in (the critical rank's idle and times), the new estimate out.

        ``overlapped``: the exchange ran behind compute (staleness ≥ 1) rather than after it (staleness 0).
        ``lower_only``: the telemetry is of a plan already being replaced; only a lowering is taken from it
        (it is set from the measured rate, so taking it again is idempotent — a raise compounds, it is not).
        ``latency_s``: the exchange's fixed cost L (module docstring; 0: the paper's rule).
        ``censored``: no link's delivery rate was measured for this tick (no link backlogged); with paced
        probing on, only then does a raise probe (a measured tick's estimate is the delivery rate).
        """
        vals = (idle, iteration_s, compute_s, now)
        if not all(math.isfinite(v) for v in vals) or iteration_s <= 0 or compute_s < 0:
            raise RemoteProtocolError("idle telemetry must be finite, iteration time > 0", value=vals)
        if bytes_per_iteration is not None and not (
            math.isfinite(bytes_per_iteration) and bytes_per_iteration >= 0
        ):
            raise RemoteProtocolError(
                "bytes per iteration must be finite and >= 0", value=bytes_per_iteration
            )
        cfg = self.cfg
        if not (math.isfinite(latency_s) and latency_s >= 0):
            raise RemoteProtocolError("latency must be finite and >= 0", value=latency_s)
        idle = min(max(idle, 0.0), 1.0)
        before = self._estimate
        self._since_probe += 1
        # paced probing applies once the links measured the link (apply_delivery): then a raise is a probe
        paced = cfg.bw_probe_every > 0 and self._measured is not None and cfg.link_delivery
        exposed = idle >= cfg.bw_idle_threshold
        byte_time: float | None = None  # the exchange's time net of the latency, when that is measurable
        # with the latency on, the idle rule's raises stop at the configured prior (a raise is a probe, not
        # a measurement, and an exchange of a few kB in a 50 ms round trip measures nothing): above it
        # only the link-rate floor lifts the estimate, with what the links carried
        probe_cap = max(min(cfg.bw_initial_bps, cfg.bw_max_bps), before) if latency_s > 0 else cfg.bw_max_bps
        if exposed and latency_s > 0 and bytes_per_iteration is not None and bytes_per_iteration > 0:
            predicted = 8.0 * bytes_per_iteration / before
            comm = iteration_s if overlapped else idle * iteration_s
            measured = comm - latency_s
            if predicted < cfg.latency_min_byte_share * latency_s:
                # bytes this small cannot be told from the latency's jitter: a slow exchange says nothing
                # about B (the demo under load: 48 ms over L with a 3.4 kB payload read as 0.6 Mbit/s and
                # cut the estimate 100 → 20 → 5.7). Probe upwards as the paper does below 5 % idle, so a
                # payload shrunk by an earlier drop can grow back until it is measurable
                exposed = False
            elif measured > predicted * (1.0 + cfg.bw_idle_threshold):
                byte_time = measured  # the bytes took longer than the estimate allows
            else:
                exposed = False  # they kept up with the estimate: the idle was the latency
        if lower_only and not exposed:
            return BandwidthStep("hold", before, before, None, "")
        evidence: float | None = None
        kind: StepKind
        if exposed and byte_time is not None:
            kind = "lower"
            evidence = 8.0 * float(bytes_per_iteration or 0.0) / max(byte_time, 1e-9)
            new = max(evidence / (1.0 - cfg.bw_target_idle), before * (1.0 - cfg.bw_lower_max))
            if new >= before:
                return BandwidthStep("hold", before, before, evidence, "")
            self._raise_step = cfg.bw_raise_initial
            self._hold = cfg.bw_raise_hold
        elif exposed:
            kind = "lower"
            comm = iteration_s if overlapped else idle * iteration_s
            if bytes_per_iteration is not None and bytes_per_iteration > 0 and comm > 0:
                evidence = 8.0 * bytes_per_iteration / comm
                slope = self._fit(bytes_per_iteration, comm)
                if slope is not None:
                    # the exchange's bytes-dependent part only (latency is not bandwidth)
                    evidence = 8.0 / slope if slope > 0 else math.inf
            else:
                evidence = before * (1.0 - idle)
            new = evidence / (1.0 - cfg.bw_target_idle)
            if lower_only and new >= before:
                return BandwidthStep("hold", before, before, evidence, "")
            if new > before:
                # idle, but the fit says the link carries more than we thought (the idle is latency or
                # CPU): move up towards it as a raise would, undoing an earlier misreading
                kind = "raise"
                new = min(new, before * (1.0 + self._raise_step))
                self._raise_step = min(self._raise_step * cfg.bw_raise_growth, cfg.bw_raise_max)
            else:
                new = max(new, before * (1.0 - cfg.bw_lower_max))
                self._raise_step = cfg.bw_raise_initial
                self._hold = cfg.bw_raise_hold
        else:
            need = None
            # with the latency on, the search prices every byte (search.py), so a raise makes the next
            # plan's payload grow until the link shows: the loop closes without the utilisation test
            if bytes_per_iteration is not None and compute_s > 0 and latency_s <= 0:
                need = 8.0 * bytes_per_iteration / compute_s
                evidence = need
            if need is not None and need < cfg.bw_raise_min_utilisation * before:
                kind, new = "hold", before
            elif paced:
                # an outstanding probe is judged after the base spacing (its samples' return time); only
                # the start of a probe from a measured rate waits the backed-off spacing
                wait = cfg.bw_probe_every if self._probe_from is not None else self._probe_every
                if not censored or self._since_probe < wait:
                    kind, new = "hold", before  # the samples of the last plan are not back yet
                elif self._probe_from is not None:
                    # the probe's plan ran its samples' time and nothing measured it (no link backlogged,
                    # no timed train): no evidence that the link carried it. It is undone — back to the
                    # rate it started from — and the next waits twice as long. Counting it as carried let
                    # each such probe start the next from itself, and with a plan whose payload stopped
                    # growing the estimate ran away (10-20 Gbit/s on a 100 Mbit/s link, docs/scheduler.md)
                    kind, new = "lower", min(before, self._probe_from)
                    self._probe_every = min(2 * self._probe_every, cfg.bw_probe_every_max)
                    self._probe_from = None
                    self._since_probe = 0
                else:
                    kind = "raise"
                    self._points.clear()
                    # not capped by the prior: this raise is measured (or undone) before the next one
                    new = min(before * cfg.bw_probe_gain, cfg.bw_max_bps)
                    self._probe_from = self._measured
                    self._since_probe = 0
            elif self._hold > 0:
                kind, new = "hold", before
                self._hold -= 1
            else:
                kind = "raise"
                self._points.clear()  # the link may have changed: fit afresh
                new = min(before * (1.0 + self._raise_step), probe_cap)
                self._raise_step = min(self._raise_step * cfg.bw_raise_growth, cfg.bw_raise_max)
        clamped = ""
        gp = self._fresh_goodput(now)
        if gp is not None and new < cfg.goodput_floor * gp:
            new, clamped = cfg.goodput_floor * gp, "goodput_floor"
        top = self._ceiling_basis(now)
        # the ceiling reads goodput as the link's capacity, true only if the bytes kept the link busy: with
        # the latency on, the idle is the round trip's as much as the link's (goodput of a 5 kB payload per
        # 50 ms round capped the demo's estimate at 2.2 Mbit/s), and a lowering has measured the bytes
        if top is not None and exposed and latency_s <= 0 and new > cfg.goodput_ceiling * top:
            new, clamped = cfg.goodput_ceiling * top, "goodput_ceiling"
        if new < cfg.bw_min_bps:
            new, clamped = cfg.bw_min_bps, "min"
        if new > cfg.bw_max_bps:
            new, clamped = cfg.bw_max_bps, "max"
        self._estimate = new
        return BandwidthStep(kind, before, new, evidence, clamped)
