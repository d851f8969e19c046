"""The WAN links' rate *while sending*, from the gateways' counters: a lower bound on the bandwidth that
needs no particular plan to be running.

Why: StellaTrain §4.1 ③ reads the bandwidth only from the GPU idle rate. Idle says "the link was too
slow" (and by how much: the iteration *is* the exchange), but below the threshold it says only "fast
enough" — how much faster the link has become is invisible until a plan with a bigger payload runs, so
a rise 30 → 100 Mbit/s takes a slow-start of raises, each only after the previous plan is in force
(docs/demo.md: still 0.67 off ten decide ticks after the rise). The gateways see the link directly:
every gateway reports, per peer, the time that peer's link had bytes in flight (``link.<peer>.busy_s``:
per iteration, the union of the messages' spans from first chunk to acknowledgement, summed) and the bytes
of the same iterations' messages (``link.<peer>.busy_bytes``: counted with the time, so that a window
never pairs one iteration's bytes with another's time — with the send counter ``bytes_sent`` instead,
windows read anything from 0.1 to 187 Mbit/s on a 100 Mbit/s link). Their ratio over a window is what
the link carried while it was carrying: at least its capacity minus the acknowledgement round trip per
burst, whatever the payload. Unlike the gateways' *goodput* (bytes over wall time), it does not fall when
the exchange hides behind compute and the link idles.

The job has one bandwidth B (Eq. 6): the exchange is as slow as its slowest link, so the floor is the
**minimum** over the links — and only while every link has a fresh measurement (a link that was not
measured may be the bottleneck). StellaTrain §6 ("overestimation is more harmful than underestimation ...
we adopt a conservative approach"): the floor only ever raises the estimate to what was demonstrably
carried, so it cannot cause the overshoot the paper warns about (the acknowledgement round trip in every
span keeps it below the link).

**Delivery while not application-limited** (:meth:`LinkRates.observe_backlog`,
:meth:`LinkRates.delivery_bps`): the busy spans hold the round trip and the receiver's CPU,
so under load they read a fraction of the link (20-30 Mbit/s on 100 Mbit/s links at load 7) and serve only
as a floor. A gateway that measures, per peer, the bytes delivered while it had data queued and the time
that took (``link.<peer>.backlog_bytes|backlog_s``: BBR's delivery-rate sample, Cardwell et al. 2016)
feeds this: per link the best window of the last ``link_delivery_max_age_s`` (BBR's max filter: a stalled
window reads low), over links the slowest (Eq. 6's one B), and that sets the estimate
(:meth:`BandwidthEstimator.apply_delivery`) both ways. The gateways compute the counters on their own
send/ack path, the same for TCP and the emulated link (gateways/sending/link_times.py: a large message's
span from first chunk to acknowledgement, less the link's round trip — the windowed minimum span of its
small messages); an emulator that reported its own token bucket would measure the emulator, not the WAN.

**The receivers' tails** (:meth:`LinkRates.observe_rx`): the sender's sample reads a policed link's burst
as rate (41 Mbit/s on a 30 Mbit/s link after each idle gap); the receiving gateway's tail dispersion of
each large message (``link.<sender>.rx_*``, gateways/sending/rx_dispersion.py) does not. Per direction it
replaces the sender's sample while fresh, filtered by a censored median (:mod:`scheduler.control.link_rx`);
a direction whose tails mostly crossed too fast to measure is left out.

Sans-IO: counters and ``now`` are passed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from scheduler.control.config import SchedulerConfig
from scheduler.control.link_rx import RxLink
from wanrt.errors import RemoteProtocolError

__all__ = ["LinkRates"]

#: links remembered at most (a gateway reports at most 48 peers; a job's links are sites × peers)
MAX_LINKS = 4096


def _make_room(table: dict[str, Any]) -> None:
    """Before a new link enters a full table: forget the one reported longest ago (a link that went away)."""
    if len(table) >= MAX_LINKS:
        del table[min(table, key=lambda k: table[k].seen_at)]


@dataclass(slots=True)
class _Link:
    bytes0: float  # counters at the start of the current window
    busy0: float
    rate_bps: float | None = None
    measured_at: float | None = None
    seen_at: float = 0.0
    #: the last window's bytes, busy seconds and the gateway's peak (for the decisions file)
    window: tuple[float, float, float] = (0.0, 0.0, 0.0)
    #: (time, rate) of the recent delivery windows (the delivery measurement's max filter)
    samples: list[tuple[float, float]] = field(default_factory=list)


class LinkRates:
    """Per link: the rate over the last window of at least ``link_rate_min_busy_s`` busy seconds."""

    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.cfg = config if config is not None else SchedulerConfig()
        self._links: dict[str, _Link] = {}
        self._delivery: dict[str, _Link] = {}  # the same windows over the backlog counters
        self._rx: dict[str, RxLink] = {}  # ... and over the receivers' tail-dispersion counters
        self._paced: dict[str, tuple[float, float]] = {}  # link -> (its sender's pacing rate, when)
        self._probes: dict[str, _Link] = {}  # ... and over the receivers' timed probe trains

    def observe_backlog(self, link: str, *, nbytes: float, seconds: float, now: float) -> float | None:
        """Cumulative counters of ``link``'s delivery while backlogged (bytes, seconds: the gateway's
        ``link.<peer>.backlog_bytes|backlog_s``); returns a new delivery rate (bit/s) when the window since
        the last one holds at least ``link_delivery_min_s`` of backlog.

        Why a second measurement: the busy time above runs from a message's first chunk to its
        acknowledgement, so it holds the round trip and the receiver's CPU (under load 7 a 2 kB message's
        span was 100-160 ms, and a 100 Mbit/s link read 20-30 Mbit/s); the backlog periods hold only
        the time bytes queued for the link, so their rate is the link's (TCP's delivery-rate sample)."""
        # BBR's windowed max filter: a delivery sample is bounded by the link, but a
        # receiver that stalled (its gateway's loop busy, the socket full) reads below it — on two loaded
        # cores 55-115 Mbit/s windows on a 100 Mbit/s link — so the link is the best recent window
        return self._observe_window(self._delivery, link, nbytes, seconds, now)

    def observe_rx(
        self,
        link: str,
        *,
        nbytes: float,
        seconds: float,
        now: float,
        n: float | None = None,
        fast: float | None = None,
    ) -> float | None:
        """Cumulative counters of ``link``'s tail dispersion at its receiver (``link.<sender>.rx_bytes|rx_s``
        and the tail counts ``rx_n`` (measured) / ``rx_fast`` (too short to measure), reported by the
        receiving gateway; ``link`` is ``sender>receiver``); returns a new window's rate (bit/s) when the
        tails since the last one hold at least ``link_delivery_min_s``.

        Why: the sender's delivery sample above reads a token bucket's burst as rate (~41 Mbit/s on a
        30 Mbit/s policed link: the burst crosses at once after each idle gap), while a message's tail at
        the receiver is paced by the bottleneck alone (gateways/sending/rx_dispersion.py). Filtered by
        a censored median over the same age and count (:mod:`scheduler.control.link_rx`)."""
        st = self._rx.get(link)
        if st is None:
            _make_room(self._rx)
            st = self._rx[link] = RxLink(nbytes, seconds, n or 0.0, fast or 0.0, seen_at=now)
        cfg = self.cfg
        return st.observe(
            nbytes=nbytes,
            seconds=seconds,
            n=n,
            fast=fast,
            now=now,
            min_s=cfg.link_delivery_min_s,
            max_age=cfg.link_rx_max_age_s,
            min_samples=cfg.link_delivery_min_samples,
            how=cfg.link_rx_filter,
        )

    def observe_probe(self, link: str, *, nbytes: float, seconds: float, now: float) -> float | None:
        """Cumulative counters of the timed probe trains' tails on ``link`` (``sender>receiver``; the
        receiving gateway's ``link.<sender>.probe_bytes|probe_s``); returns a new train window's rate, bit/s.

        Why: a link faster than the plan's messages gives no measured tail at all (every one crosses inside
        the burst: "fast"), and the estimator could only guess upwards. A train is sized by the receiver to
        be timed at the rate it tests (gateways/sending/probe_trains.py), so it is a measurement whatever
        the plan sends. Filtered by the best window of the last ``link_probe_max_age_s`` (BBR's max: a
        train is timed only when its tail outlasts the burst, so it reads the link or, behind a stalled
        receiver, below it)."""
        vals = (nbytes, seconds, now)
        if not all(math.isfinite(v) for v in vals) or nbytes < 0 or seconds < 0:
            raise RemoteProtocolError("probe counters must be finite and >= 0", value=vals)
        st = self._probes.get(link)
        if st is None:
            _make_room(self._probes)
            self._probes[link] = _Link(nbytes, seconds, seen_at=now)
            return None
        st.seen_at = now
        if nbytes < st.bytes0 or seconds < st.busy0:
            st.bytes0, st.busy0 = nbytes, seconds  # the receiving gateway restarted
            return None
        busy = seconds - st.busy0
        if busy <= 0 or nbytes <= st.bytes0:
            return None
        rate = 8.0 * (nbytes - st.bytes0) / busy
        st.window = (nbytes - st.bytes0, busy, 0.0)
        st.bytes0, st.busy0 = nbytes, seconds
        st.samples = [(t, r) for t, r in st.samples if now - t <= self.cfg.link_probe_max_age_s]
        st.samples.append((now, rate))
        st.rate_bps = max(r for _, r in st.samples)
        st.measured_at = now
        return rate

    def _probe_rates(self, now: float) -> dict[str, tuple[float, float]]:
        """Per link, (its probe rate, when) if a train was timed within ``link_probe_max_age_s``."""
        max_age = self.cfg.link_probe_max_age_s
        out: dict[str, tuple[float, float]] = {}
        for k, v in list(self._probes.items()):
            if now - v.seen_at > 4 * max(max_age, self.cfg.link_rx_max_age_s):
                del self._probes[k]
                continue
            if v.measured_at is None or v.rate_bps is None or now - v.measured_at > max_age:
                continue
            fresh = [r for t, r in v.samples if now - t <= max_age]
            if fresh:
                out[k] = (max(fresh), v.measured_at)
        return out

    def _observe_window(
        self, table: dict[str, _Link], link: str, nbytes: float, seconds: float, now: float
    ) -> float | None:
        vals = (nbytes, seconds, now)
        if not all(math.isfinite(v) for v in vals) or nbytes < 0 or seconds < 0:
            raise RemoteProtocolError("delivery counters must be finite and >= 0", value=vals)
        st = table.get(link)
        if st is None:
            _make_room(table)
            table[link] = _Link(nbytes, seconds, seen_at=now)
            return None
        st.seen_at = now
        if nbytes < st.bytes0 or seconds < st.busy0:
            st.bytes0, st.busy0 = nbytes, seconds  # a new connection: its counters start again
            return None
        busy = seconds - st.busy0
        if busy < self.cfg.link_delivery_min_s:
            return None
        rate = 8.0 * (nbytes - st.bytes0) / busy
        st.window = (nbytes - st.bytes0, busy, 0.0)
        st.bytes0, st.busy0 = nbytes, seconds
        st.samples = [(t, r) for t, r in st.samples if now - t <= self.cfg.link_delivery_max_age_s]
        st.samples.append((now, rate))
        if len(st.samples) < self.cfg.link_delivery_min_samples:
            return None  # too few windows for the filter to see past a stalled one
        st.rate_bps = max(r for _, r in st.samples)
        st.measured_at = now
        return rate

    def delivery_bps(self, now: float) -> float | None:
        """The slowest delivery rate among the links that were backlogged within
        ``link_delivery_max_age_s`` (None: none was). A link that did not backlog carried what it was
        given without queueing: it is not the bottleneck at the running plan, and it is left out. Per link
        (one direction), its receiver's tail rate when it has a fresh one (``link_rx``), else its sender's
        delivery sample: the tail excludes the burst the sender's sample cannot separate. A link whose
        receiver saw most tails cross too fast to measure is left out, its sender's sample too, and so is
        one whose rate reached ``link_paced_share`` of its sender's pacing rate (application-limited).
        A link whose receiver timed a probe train within ``link_probe_max_age_s`` has that train's rate
        (:meth:`observe_probe`) unless its tails measured it since."""
        max_age = self.cfg.link_delivery_max_age_s
        for table in (self._delivery, self._rx):
            for k in [
                k for k, v in table.items() if now - v.seen_at > 4 * max(max_age, self.cfg.link_rx_max_age_s)
            ]:
                del table[k]
        per_link: dict[str, float] = {}
        for k, v in self._delivery.items():
            if v.rate_bps is not None and v.measured_at is not None and now - v.measured_at <= max_age:
                per_link[k] = v.rate_bps
        if self.cfg.link_rx:
            for k, rx in self._rx.items():
                kind, rate = rx.judged(now, max_age)  # judged within the last max_age, over link_rx_max_age_s
                if kind == "rate" and rate is not None:
                    per_link[k] = rate
                elif kind == "fast":
                    per_link.pop(k, None)
        for k in list(per_link):
            paced = self._paced.get(k)
            fresh = paced is not None and now - paced[1] <= 4 * max_age
            if fresh and paced is not None and per_link[k] >= self.cfg.link_paced_share * paced[0]:
                del per_link[k]  # application-limited: wanrt's pacer, not the link, set this rate
        for k, (rate, at) in self._probe_rates(now).items():
            # a timed train measured the link whatever the plan sent (and passed the pacer, so the
            # application-limited rule above does not apply to it); the receiver's tails of the job's own
            # messages win only if they judged a rate more recently and were not paced
            tails = self._rx.get(k)
            newer = k in per_link and tails is not None and (tails.measured_at or -math.inf) > at
            if not newer:
                per_link[k] = rate
        return min(per_link.values()) if per_link else None

    def observe_pacing(self, link: str, rate_bps: float, now: float) -> None:
        """``link``'s sender paces it at ``rate_bps`` (the gateway's ``link.<peer>.rate_bps``): a delivery
        rate near it measured the pacer (:meth:`delivery_bps` leaves such a link out)."""
        if not (math.isfinite(rate_bps) and rate_bps > 0 and math.isfinite(now)):
            raise RemoteProtocolError("pacing rate must be finite and > 0", value=rate_bps)
        if link not in self._paced and len(self._paced) >= MAX_LINKS:
            del self._paced[min(self._paced, key=lambda k: self._paced[k][1])]
        self._paced[link] = (float(rate_bps), float(now))

    def delivery_windows(self) -> dict[str, tuple[float, float, float]]:
        """Per link, its last delivery window: (bytes, backlogged seconds, 0)."""
        return {k: v.window for k, v in self._delivery.items() if v.rate_bps is not None}

    def rx_windows(self) -> dict[str, tuple[float, float, float]]:
        """Per link, its last receiver-tail window: (bytes, tail seconds, filtered rate bit/s)."""
        return {k: (*v.window, v.rate_bps) for k, v in self._rx.items() if v.rate_bps is not None}

    def observe(
        self, link: str, *, bytes_sent: float, busy_s: float, now: float, peak_bps: float | None = None
    ) -> float | None:
        """Cumulative counters of ``link`` (bytes sent, seconds busy); returns a new rate (bit/s) when the
        window since the last one holds enough busy time, else None. ``peak_bps``: the gateway's fastest
        message of its last reported iteration (bytes over its span); the window's rate is the larger of
        the two lower bounds. A counter that went backwards (the gateway restarted) starts a new window."""
        vals = (bytes_sent, busy_s, now, 0.0 if peak_bps is None else peak_bps)
        if not all(math.isfinite(v) for v in vals) or min(vals[:2]) < 0 or vals[3] < 0:
            raise RemoteProtocolError("link counters must be finite and >= 0", value=vals)
        st = self._links.get(link)
        if st is None:
            _make_room(self._links)
            self._links[link] = _Link(bytes_sent, busy_s, seen_at=now)
            return None
        st.seen_at = now
        if bytes_sent < st.bytes0 or busy_s < st.busy0:
            st.bytes0, st.busy0 = bytes_sent, busy_s
            return None
        busy = busy_s - st.busy0
        if busy < self.cfg.link_rate_min_busy_s:
            return None
        st.rate_bps = max(8.0 * (bytes_sent - st.bytes0) / busy, peak_bps or 0.0)
        st.window = (bytes_sent - st.bytes0, busy, peak_bps or 0.0)
        st.measured_at = now
        st.bytes0, st.busy0 = bytes_sent, busy_s
        return st.rate_bps

    def rates(self) -> dict[str, float]:
        return {k: v.rate_bps for k, v in self._links.items() if v.rate_bps is not None}

    def windows(self) -> dict[str, tuple[float, float, float]]:
        """Per measured link, its last window: (bytes, busy seconds, peak bit/s)."""
        return {k: v.window for k, v in self._links.items() if v.rate_bps is not None}

    def floor_bps(self, now: float) -> float | None:
        """The slowest link's rate while sending over the links measured within ``link_rate_max_age_s``;
        None if there is none, or if a link's gateway stopped reporting (it may be the bottleneck). A link
        still reported but without a fresh window carried less than ``link_rate_min_busy_s`` of busy time
        since its last one: it is nearly idle, not the bottleneck, and left out."""
        max_age = self.cfg.link_rate_max_age_s
        for k in [k for k, v in self._links.items() if now - v.seen_at > 4 * max_age]:
            del self._links[k]  # no longer reported at all: the old topology's link
        fresh: list[float] = []
        for st in self._links.values():
            if now - st.seen_at > max_age:
                return None
            if st.rate_bps is not None and st.measured_at is not None and now - st.measured_at <= max_age:
                fresh.append(st.rate_bps)
        return min(fresh) if fresh else None
