"""When to ask a peer for a timed probe train, and how large (issue 25).

The wire messages are in :mod:`wanrt.protocol.peer.probe_train`.

**The maths.** The receiver times a message by its tail (gateways/sending/rx_dispersion.py: the bytes after
the read that carried its half-way byte, over the time to its last byte; packet-train dispersion, Dovrolis,
Ramanathan & Moore, IEEE/ACM ToN 2004, §II) and only when that tail took at least ``rx_min_tail_s`` — a
shorter one may have crossed inside the token bucket's burst or one batched read. A train of ``S`` bytes
therefore measures a link of rate ``R`` iff ``(S/2)·8 / R ≥ rx_min_tail_s``. To test the link up to
``gain × r`` (``r`` its last measured rate) with a margin ``f`` over the threshold::

    S(r) = 2 · ⌈gain · r · f · rx_min_tail_s / 8⌉        (:func:`train_bytes`)

clamped to ``probe_min_bytes..probe_max_bytes``. A link anywhere below ``gain · f · r`` is then timed; the
first half (``S/2`` ≥ ``f·gain`` × 20 ms of rate) also outlasts a burst of 20 ms of rate, so the tail is
paced by the bottleneck. A train whose tail was still too short to time proves the link faster than
``L = (S/2)·8 / rx_min_tail_s`` (:func:`fast_bound_bps`), and the next one is sized for ``L``: at least
``gain · f`` (≈ 1.9) times larger, so a link ten times faster than believed is timed by the third train.
Measured trains are never counted as anything but what they measured: there is no "carried without a
measurement" (the runaway of docs/scheduler.md).

**When.** Only where the plan uses the link and its own traffic leaves it unmeasured: per incoming link,
once every ``probe_interval_s``, if that interval brought at least ``rx_min_bytes`` of the job's messages
(a link the plan does not use — heartbeats only — is not its bottleneck, and is not probed), unless those
messages gave at least one measured tail and no more fast tails than measured ones (then the scheduler's
censored median of the receiver's tails already has a rate, scheduler/control/link_rx.py). One train
outstanding per link; a request unanswered after four intervals (a reconnect) is given up.

**Cost.** A timed train occupies the link ``2·gain·f·rx_min_tail_s`` ≈ 75 ms at the rate it was sized for,
once a second at most: under 8 % of an otherwise idle link, and nothing where the plan's own messages are
measurable. The sender queues it after every round message (EDF's lowest priority).

Sans-IO: times are passed in; the node sends the requests and hands over the trains' tails.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateways.sending.config import DeliveryConfig
from gateways.sending.rx_dispersion import RxDispersion

__all__ = ["ProbeTrains", "fast_bound_bps", "train_bytes"]


def train_bytes(rate_bps: float, cfg: DeliveryConfig) -> int:
    """The train that times the link up to ``probe_gain × rate_bps`` (module docstring), in bytes."""
    half = math.ceil(cfg.probe_gain * rate_bps * cfg.probe_tail_factor * cfg.rx_min_tail_s / 8.0)
    return int(min(max(2 * half, cfg.probe_min_bytes), cfg.probe_max_bytes))


def fast_bound_bps(nbytes: int, cfg: DeliveryConfig) -> float:
    """The rate a train of ``nbytes`` proved when its tail was too short to time: its tail's bits over the
    threshold (a lower bound on the link)."""
    return 8.0 * (nbytes // 2) / cfg.rx_min_tail_s


@dataclass(slots=True)
class _Link:
    rate_bps: float  # what the next train is sized for: the last measured (or proved) rate
    last_probe_at: float
    samples0: int = 0  # the receiver's tail counters at the start of the interval
    fast0: int = 0
    own: int = 0  # ... and how many of the tails since then were trains' (not the job's messages)
    own_fast: int = 0
    total0: int = 0  # the bytes read on the link at the start of the interval, and the trains' among them
    own_bytes: int = 0
    outstanding: tuple[int, int, float] | None = None  # (seq, bytes, asked at)


class ProbeTrains:
    """Per incoming link (keyed by peer), the probe requests due and the trains' measured tails.

    Counters for the telemetry (``link.<peer>.probe_bytes|probe_s``): the measured trains' tail bytes
    and seconds, summed — the scheduler's per-link probe rate over a window is their ratio
    (scheduler/control/link_rate.py)."""

    def __init__(self, config: DeliveryConfig | None = None) -> None:
        self.cfg = config if config is not None else DeliveryConfig()
        self._links: dict[str, _Link] = {}
        self._seq = 0
        self.probe_bytes: dict[str, int] = {}
        self.probe_s: dict[str, float] = {}
        self.trains = 0
        self.fast_trains = 0
        #: per peer, when we last sent it a train (the sender's side: one per half interval at most)
        self._sent_at: dict[str, float] = {}

    def due(self, peer: str, rx: RxDispersion, now: float) -> tuple[int, int] | None:
        """The (seq, bytes) of a train to ask ``peer`` for now, or None (module docstring, "When")."""
        cfg = self.cfg
        if not (cfg.probe_enabled and cfg.rx_enabled):
            return None
        st = self._links.get(peer)
        if st is None:
            st = self._links[peer] = _Link(cfg.probe_initial_bps, now, rx.samples, rx.fast, total0=rx.total)
            return None  # the link just came up: its first interval of traffic decides
        if st.outstanding is not None:
            if now - st.outstanding[2] < 4 * cfg.probe_interval_s:
                return None
            st.outstanding = None  # never answered (the link was replaced): ask again
        if now - st.last_probe_at < cfg.probe_interval_s:
            return None
        measured = rx.samples - st.samples0 - st.own
        fast = rx.fast - st.fast0 - st.own_fast
        job_bytes = rx.total - st.total0 - st.own_bytes
        st.samples0, st.fast0, st.own, st.own_fast, st.last_probe_at = rx.samples, rx.fast, 0, 0, now
        st.total0, st.own_bytes = rx.total, 0
        if job_bytes < cfg.rx_min_bytes:
            return None  # the plan does not use this link (heartbeats only): not its bottleneck
        if measured >= 1 and fast <= measured:
            if rx.last is not None and rx.last[1] > 0:
                st.rate_bps = 8.0 * rx.last[0] / rx.last[1]  # the next train is sized from it
            return None  # the job's own messages were timed this interval
        self._seq += 1
        nbytes = train_bytes(st.rate_bps, cfg)
        st.outstanding = (self._seq, nbytes, now)
        return self._seq, nbytes

    def train(
        self, peer: str, seq: int, nbytes: int, sample: tuple[int, float] | None, fast: bool, now: float
    ) -> None:
        """Train ``seq`` of ``nbytes`` arrived from ``peer``: its tail ``sample`` (bytes, seconds), or
        ``fast`` (too short to time: it proved :func:`fast_bound_bps`), or neither (not timeable at all: its
        half-way read had left the ring). A train we did not ask for (or a stale one) still counts if it
        was timed: its tail is a measurement like any other."""
        st = self._links.get(peer)
        if st is not None:
            st.own_bytes += nbytes
        if sample is not None and sample[1] > 0:
            self.probe_bytes[peer] = self.probe_bytes.get(peer, 0) + sample[0]
            self.probe_s[peer] = self.probe_s.get(peer, 0.0) + sample[1]
            self.trains += 1
            if st is not None:
                st.rate_bps = 8.0 * sample[0] / sample[1]
                st.own += 1
        elif fast:
            self.fast_trains += 1
            if st is not None:
                st.rate_bps = max(st.rate_bps, fast_bound_bps(nbytes, self.cfg))
                st.own_fast += 1
        if st is not None and st.outstanding is not None and st.outstanding[0] == seq:
            st.outstanding = None

    def may_send(self, peer: str, nbytes: int, now: float) -> bool:
        """Whether to answer ``peer``'s request for a train of ``nbytes`` (the sender's bound: within
        ``probe_max_bytes``, and one per half interval per peer, whatever the peer asks)."""
        cfg = self.cfg
        if not cfg.probe_enabled or nbytes > cfg.probe_max_bytes:
            return False
        last = self._sent_at.get(peer)
        if last is not None and now - last < cfg.probe_interval_s / 2:
            return False
        self._sent_at[peer] = now
        return True

    def forget(self, peer: str) -> None:
        """``peer`` left the job: its state goes (its counters stay, they are cumulative)."""
        self._links.pop(peer, None)
        self._sent_at.pop(peer, None)
