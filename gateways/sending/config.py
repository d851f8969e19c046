"""Settings of the gateway's sans-IO send-side policies: the EDF send queue and the rate allocator.

Kept apart from :mod:`gateways.config` (which also pulls in the transports' configs, and with them
asyncio) so that :mod:`gateways.sending.edf_queue`, :mod:`gateways.sending.rate_allocator` and the
simulator import no I/O machinery.
:mod:`gateways.config` re-exports both classes; they load from ``[gateway.edf]`` and ``[gateway.rates]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from wanrt.config import check
from wanrt.protocol.limits import MIN_CHUNK_BYTES

__all__ = ["MAX_CHUNK_BYTES", "DeliveryConfig", "EdfConfig", "RateConfig"]

#: A chunk is the unit of non-preemption on a link: at 100 Mbit/s a 16 MiB chunk already blocks an urgent
#: layer for 1.3 s, so larger chunks defeat EDF; it also stays far below any sane frame-size limit.
MAX_CHUNK_BYTES: Final = 16 << 20


@dataclass(frozen=True)
class EdfConfig:
    """The per-link send queue (:mod:`gateways.sending.edf_queue`).

    ``edf`` sends the most urgent (iteration, layer) first, StellaTrain §3.3; ``fifo`` is the first-come
    baseline kept for the EDF-vs-FIFO comparison. Chunks bound how long an urgent layer waits behind a
    large one already on the wire. Pieces shorter than ``coalesce_bytes`` (message headers, tiny layers) are
    copied together into one chunk rather than each paying a frame.
    """

    policy: Literal["edf", "fifo"] = "edf"
    chunk_bytes: int = 256 << 10
    coalesce_bytes: int = 4 << 10

    def __post_init__(self) -> None:
        check(
            MIN_CHUNK_BYTES <= self.chunk_bytes <= MAX_CHUNK_BYTES,
            "chunk_bytes",
            self.chunk_bytes,
            f"must be in {MIN_CHUNK_BYTES}..{MAX_CHUNK_BYTES}",
        )
        check(
            0 <= self.coalesce_bytes <= self.chunk_bytes,
            "coalesce_bytes",
            self.coalesce_bytes,
            "must be in 0..chunk_bytes",
        )


@dataclass(frozen=True)
class RateConfig:
    """Straggler-link rate reallocation (:mod:`gateways.sending.rate_allocator`), seed 002 "Straggler-Aware
    Scheduler".

    Paper values are the defaults: streak K = 3 iterations slower than 1.2 × the median, boost α = 0.3,
    donor penalty β = 0.15 shared by the donors, recovery r ← 0.5·r + 0.5·r_base, cooldown 5 iterations.
    ``max_boost``, ``min_share`` and ``conserve_total`` are ours: the paper compounds boosts without a bound
    and lets the sum of rates drift above the base sum, which a real uplink cannot honour.

    ``hold`` is ours too: recovery is gated on the link's time *at its base rate* (its measured time scaled
    by ``r_i / r_base``, inverting the paper's network model ``delay_i = d_base / r_i``) instead of on its
    boosted time. A persistent straggler that a boost has fixed is still slow at its base rate, so its
    boost and the donors' penalty that pays for it are held; the paper's literal rule (``hold = false``)
    recovers the moment the boost works, lets the link fall back into straggling and re-boosts it — a
    boost/recover sawtooth (1.6× to 2.9× on the 3× straggler) that costs the rounds spent on the way.
    """

    enabled: bool = True
    streak: int = 3
    slow_factor: float = 1.2
    alpha: float = 0.3
    beta: float = 0.15
    recovery: float = 0.5
    cooldown: int = 5
    max_boost: float = 4.0
    min_share: float = 0.25
    conserve_total: bool = False
    hold: bool = True

    def __post_init__(self) -> None:
        check(1 <= self.streak <= 1000, "streak", self.streak, "must be in 1..1000 iterations")
        check(1.0 < self.slow_factor <= 100.0, "slow_factor", self.slow_factor, "must be in (1, 100]")
        check(0.0 < self.alpha <= 10.0, "alpha", self.alpha, "must be in (0, 10]")
        check(0.0 <= self.beta < 1.0, "beta", self.beta, "must be in [0, 1)")
        check(0.0 < self.recovery <= 1.0, "recovery", self.recovery, "must be in (0, 1]")
        check(0 <= self.cooldown <= 10_000, "cooldown", self.cooldown, "must be in 0..10000 iterations")
        check(1.0 <= self.max_boost <= 100.0, "max_boost", self.max_boost, "must be in [1, 100]")
        check(0.0 < self.min_share <= 1.0, "min_share", self.min_share, "must be in (0, 1]")


@dataclass(frozen=True)
class DeliveryConfig:
    """The links' delivery-rate samples (:mod:`gateways.sending.link_times`), reported to the scheduler as
    ``link.<peer>.backlog_bytes|backlog_s``.

    A message's span (first chunk out to the peer's acknowledgement) holds one round trip besides its bytes'
    time; the round trip is the link's minimum span of small messages (``rtprop_max_bytes`` or less) over
    the last ``rtprop_window_s`` (BBR's RTprop, Cardwell et al. 2016: a windowed min, so queueing and the
    peer's CPU only ever lengthen a span, never shorten the floor). Only messages of at least ``min_bytes``
    whose span exceeds it by ``min_net_s`` are samples. Why 20 ms: a policed link (a token bucket, like the
    emulated links with their 20 ms burst) lets an idle link's first burst of bytes go at once, so a
    message that fits in the burst crosses in the round trip's jitter and would read as any rate at all;
    past the burst a message reads fast by burst / size only. ``enabled = false`` reports nothing.

    The receiver's side (:mod:`gateways.sending.rx_dispersion`, reported as ``link.<peer>.rx_bytes|rx_s``:
    the peer → us direction): per incoming message of at least ``rx_min_bytes`` on the wire, the rate of
    its second half (packet-train dispersion: the burst only speeds up the head), a sample only if that
    tail took at least ``rx_min_tail_s`` (20 ms, the emulated burst's length: a shorter tail may have
    crossed inside a burst or one batched read). ``rx_ring_reads`` bounds the reads remembered per link
    (a message whose half-way byte is older gives no sample; at 30 Mbit/s a 140 kB tail is ~100 reads
    of TCP segments). ``rx_enabled = false`` reports nothing.

    Timed probe trains (:mod:`gateways.sending.probe_trains`, issue 25), only while the gateway reports to
    a scheduler: per incoming link, when the last ``probe_interval_s`` brought no measured tail of the
    job's own messages (or more fast ones than measured), the receiver asks its peer for a train sized so
    that its tail lasts ``probe_tail_factor`` × ``rx_min_tail_s`` at ``probe_gain`` × the link's last
    measured rate (``probe_initial_bps`` before any), within ``probe_min_bytes``..``probe_max_bytes``.
    A train whose tail was still too fast to time proves the link faster than that, and the next is sized
    for the rate it proved. ``probe_enabled = false`` sends and asks for none.
    """

    enabled: bool = True
    min_bytes: int = 64 << 10
    rtprop_max_bytes: int = 16 << 10
    rtprop_window_s: float = 10.0
    min_net_s: float = 0.02
    rx_enabled: bool = True
    rx_min_bytes: int = 64 << 10
    rx_min_tail_s: float = 0.02
    rx_ring_reads: int = 4096
    probe_enabled: bool = True
    probe_interval_s: float = 1.0
    probe_gain: float = 1.5
    probe_tail_factor: float = 1.25
    probe_initial_bps: float = 100e6
    probe_min_bytes: int = 128 << 10
    probe_max_bytes: int = 4 << 20

    def __post_init__(self) -> None:
        check(1 <= self.min_bytes <= 1 << 30, "min_bytes", self.min_bytes, "must be in 1..2**30")
        check(
            1 <= self.rtprop_max_bytes <= self.min_bytes,
            "rtprop_max_bytes",
            self.rtprop_max_bytes,
            "must be in 1..min_bytes",
        )
        check(0.1 <= self.rtprop_window_s <= 3600, "rtprop_window_s", self.rtprop_window_s, "0.1..3600 s")
        check(0.0 < self.min_net_s <= 10.0, "min_net_s", self.min_net_s, "must be in (0, 10] s")
        check(2 <= self.rx_min_bytes <= 1 << 30, "rx_min_bytes", self.rx_min_bytes, "must be in 2..2**30")
        check(0.0 < self.rx_min_tail_s <= 10.0, "rx_min_tail_s", self.rx_min_tail_s, "must be in (0, 10] s")
        check(2 <= self.rx_ring_reads <= 1 << 20, "rx_ring_reads", self.rx_ring_reads, "2..2**20 reads")
        check(
            0.05 <= self.probe_interval_s <= 3600, "probe_interval_s", self.probe_interval_s, "0.05..3600 s"
        )
        check(1.0 <= self.probe_gain <= 16.0, "probe_gain", self.probe_gain, "must be in [1, 16]")
        check(
            1.0 <= self.probe_tail_factor <= 16.0, "probe_tail_factor", self.probe_tail_factor, "in [1, 16]"
        )
        check(1e3 <= self.probe_initial_bps <= 1e12, "probe_initial_bps", self.probe_initial_bps, "1e3..1e12")
        check(
            self.rx_min_bytes <= self.probe_min_bytes <= self.probe_max_bytes <= 4 << 20,
            "probe_max_bytes",
            (self.probe_min_bytes, self.probe_max_bytes),
            "need rx_min_bytes <= probe_min_bytes <= probe_max_bytes <= 4 MiB",
        )
