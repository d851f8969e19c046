"""The gateway's counters, and the three ways they are shown: /status JSON, /metrics text, the stats file.

Counters are plain numbers updated by the daemon as events happen; the views are pure functions of a status
snapshot (a JSON-able dict), so /metrics and /status can never disagree and the formats are testable
without a daemon. The stats file (``--stats-file``, written at shutdown) is read by ``wanrt demo``; its keys
``site``, ``bytes_sent``, ``bytes_received``, ``per_peer.<site>.bytes_sent|bytes_received``,
``rounds_completed``, ``late_contributions`` and ``peers_lost`` are a contract.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from gateways.rounds.actions import RoundClosed
from gateways.sending.edf_queue import PeerQueueStats
from gateways.sending.rate_allocator import LinkState
from wanrt.protocol.peer.contrib_ids import count_older, site_names

__all__ = ["GatewayStats", "LinkCounters", "PeerStatus", "peer_view", "render_prometheus"]

#: Rounds listed in /status under ``recent_rounds``.
RECENT_ROUNDS: Final = 32


@dataclass(slots=True)
class LinkCounters:
    """Byte and message counters of one peer, kept across its reconnects (for /metrics and stats)."""

    bytes_sent: int = 0
    bytes_received: int = 0
    messages_sent: int = 0
    messages_received: int = 0


@dataclass(slots=True)
class PeerStatus:
    """One peer as /status shows it; counters survive reconnects."""

    state: str = "down"  # up | down (never connected, or reconnecting) | lost (declared lost by the engine)
    since: float = 0.0
    reason: str = ""
    connects: int = 0
    losses: int = 0
    counters: LinkCounters = field(default_factory=LinkCounters)


class GatewayStats:
    """Event counters of one gateway."""

    def __init__(self, site: str, peers: list[str]) -> None:
        self.site = site
        #: one entry per peer listed here, plus any other peer once it shows up (:meth:`peer`): a gateway
        #: that links only to its plan neighbours (``links = "plan"``) keeps a handful, not one per site
        self.peers: dict[str, PeerStatus] = {p: PeerStatus() for p in sorted(peers)}
        self.rounds_completed = 0
        self.rounds_settled = 0  # closed without a result reaching this site (partition, abandoned)
        self.late_contributions = 0  # contributions counted in a later round than their own
        self.late_children = 0  # children a round proceeded without (x-order)
        self.peers_lost = 0
        self.suspects = 0
        self.trainer_pushes = 0
        self.trainer_connections = 0
        self.aggregates_delivered = 0
        self.rejected_connections = 0
        self.non_finite_dropped = 0  # payloads with NaN/Inf counted as empty (non_finite = drop_payload)
        #: per site, how many rounds in a row closed here without its contribution (a site whose gateway is
        #: up but whose trainer is not running, or too slow for every round): /status "missing_rounds"
        self.missing_streak: dict[str, int] = {}
        #: sites whose contribution was in a round delivered here: a site that never took part is still
        #: starting as far as the job is concerned (a model fault from it is fatal, ModelAgreement.site_fault)
        self.contributed: set[str] = set()
        #: per missing site, when its current run of missed rounds began (for sites that never contributed)
        self.missing_since: dict[str, float] = {}
        self._told_absent: set[str] = set()
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_ROUNDS)

    def round_closed(
        self, rc: RoundClosed, now: float = 0.0, absent_grace_s: float = 0.0
    ) -> list[tuple[str, int]]:
        """Count one closed round; returns the sites whose run of missed rounds just reached a length
        worth a warning: 3, then every 100, for a site that contributed before; for one that never did
        (its trainer may still be starting), once it has been missing ``absent_grace_s``, then every 100."""
        if rc.delivered:
            self.rounds_completed += 1
        else:
            self.rounds_settled += 1
        warn: list[tuple[str, int]] = []
        if rc.delivered:
            present = site_names(rc.sites)
            self.contributed.update(present)
            for site in list(self.missing_streak):
                if site in present:
                    del self.missing_streak[site]
                    self.missing_since.pop(site, None)
            for site in rc.missing:
                n = self.missing_streak[site] = self.missing_streak.get(site, 0) + 1
                since = self.missing_since.setdefault(site, now)
                if site in self.contributed:
                    if n == 3 or n % 100 == 0:
                        warn.append((site, n))
                elif now - since >= absent_grace_s and (site not in self._told_absent or n % 100 == 0):
                    self._told_absent.add(site)
                    warn.append((site, n))
        self.late_contributions += count_older(rc.sites, rc.iteration)
        self.late_children += len(rc.late)
        self.recent.append(
            {
                "iteration": rc.iteration,
                "layer": rc.layer,
                "contributions": len(rc.sites),
                "missing": list(rc.missing),
                "late": list(rc.late),
                "duration_s": round(rc.duration, 6),
                "delivered": rc.delivered,
            }
        )
        return warn

    def peer(self, peer: str) -> PeerStatus:
        """The entry of ``peer``, made on first use (peers not listed at construction)."""
        st = self.peers.get(peer)
        if st is None:
            st = self.peers[peer] = PeerStatus()
        return st

    def peer_state(self, peer: str, state: str, now: float, reason: str = "") -> None:
        st = self.peer(peer)
        if state == "up":
            st.connects += 1
        if state == "lost":
            st.losses += 1
            self.peers_lost += 1
        st.state, st.since, st.reason = state, now, reason

    def bytes_sent(self) -> int:
        return sum(p.counters.bytes_sent for p in self.peers.values())

    def bytes_received(self) -> int:
        return sum(p.counters.bytes_received for p in self.peers.values())

    def counters(self) -> dict[str, Any]:
        """The flat counters (shared by /status and the stats file)."""
        return {
            "site": self.site,
            "bytes_sent": self.bytes_sent(),
            "bytes_received": self.bytes_received(),
            "per_peer": {
                p: {"state": s.state, "connects": s.connects, "losses": s.losses, **asdict(s.counters)}
                for p, s in self.peers.items()
            },
            "rounds_completed": self.rounds_completed,
            "rounds_settled": self.rounds_settled,
            "late_contributions": self.late_contributions,
            "late_children": self.late_children,
            "peers_lost": self.peers_lost,
            "suspects": self.suspects,
            "trainer_pushes": self.trainer_pushes,
            "trainer_connections": self.trainer_connections,
            "aggregates_delivered": self.aggregates_delivered,
            "rejected_connections": self.rejected_connections,
            "non_finite_dropped": self.non_finite_dropped,
        }


def peer_view(
    st: PeerStatus, link: LinkState, queue: PeerQueueStats | None, *, live: bool, t0: float
) -> dict[str, Any]:
    """One peer in /status: link state, the allocator's view of the link, its send queue, counters."""
    return {
        "state": st.state,
        "since_s": round(st.since - t0, 3) if st.since else None,
        "reason": st.reason,
        "live": live,
        "rate_bps": link.rate_bps,
        "base_rate_bps": link.base_bps,
        "straggler": link.straggler,
        "streak": link.streak,
        "last_link_time_s": link.last_time_s,
        "queue_items": 0 if queue is None else queue.queued_items,
        "queue_bytes": 0 if queue is None else queue.queued_bytes,
        "connects": st.connects,
        "losses": st.losses,
        "bytes_sent": st.counters.bytes_sent,
        "bytes_received": st.counters.bytes_received,
    }


# -------------------------------------------------------------------------------------------------------
# Prometheus text exposition (version 0.0.4)
# -------------------------------------------------------------------------------------------------------

_COUNTERS: Final = (
    ("rounds_completed", "Rounds whose result was delivered at this site"),
    ("rounds_settled", "Rounds closed without a result at this site (partition, abandoned)"),
    ("late_contributions", "Contributions counted in a later round than their own (folded, x-order)"),
    ("late_children", "Children a round proceeded without (x-order deadline)"),
    ("peers_lost", "Peers declared lost"),
    ("suspects", "Peers the round engine reported silent"),
    ("trainer_pushes", "Pushes received from this site's trainer"),
    ("aggregates_delivered", "Aggregates delivered to this site's trainer"),
    ("rejected_connections", "Connections refused (authentication, protocol, limits)"),
)


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if isinstance(value, float) else str(value)


def render_prometheus(status: Mapping[str, Any]) -> str:
    """/metrics text from a /status snapshot (see :meth:`GatewayDaemon.status`)."""
    site = _esc(str(status["site"]))
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[dict[str, str], float]]) -> None:
        full = f"wanrt_gateway_{name}"
        lines.append(f"# HELP {full} {help_text}")
        lines.append(f"# TYPE {full} {kind}")
        for labels, value in samples:
            text = ",".join(f'{k}="{_esc(v)}"' for k, v in {"site": site, **labels}.items())
            lines.append(f"{full}{{{text}}} {_num(value)}")

    counters = status["counters"]
    peers: Mapping[str, Mapping[str, Any]] = status["peers"]
    for key, help_text in _COUNTERS:
        metric(f"{key}_total", "counter", help_text, [({}, counters[key])])
    per_peer = counters["per_peer"]
    for key, help_text in (
        ("bytes_sent", "Bytes sent to the peer gateway"),
        ("bytes_received", "Bytes received from the peer gateway"),
    ):
        metric(f"{key}_total", "counter", help_text, [({"peer": p}, c[key]) for p, c in per_peer.items()])
    metric(
        "peer_up",
        "gauge",
        "1 if the link to the peer is up",
        [({"peer": p}, int(v["state"] == "up")) for p, v in peers.items()],
    )
    metric(
        "peer_live",
        "gauge",
        "1 if the round engine counts the peer in",
        [({"peer": p}, int(v["live"])) for p, v in peers.items()],
    )
    metric(
        "link_rate_bps",
        "gauge",
        "Target send rate of the link (rate allocator), bit/s",
        [({"peer": p}, v["rate_bps"]) for p, v in peers.items()],
    )
    metric(
        "link_base_rate_bps",
        "gauge",
        "Configured base rate of the link, bit/s",
        [({"peer": p}, v["base_rate_bps"]) for p, v in peers.items()],
    )
    metric(
        "link_straggler",
        "gauge",
        "1 while the link is a confirmed straggler (seed 002)",
        [({"peer": p}, int(v["straggler"])) for p, v in peers.items()],
    )
    metric(
        "queue_items",
        "gauge",
        "Messages queued for the peer (EDF send queue)",
        [({"peer": p}, v["queue_items"]) for p, v in peers.items()],
    )
    metric(
        "queue_bytes",
        "gauge",
        "Bytes queued for the peer (EDF send queue)",
        [({"peer": p}, v["queue_bytes"]) for p, v in peers.items()],
    )
    metric(
        "frontier_iteration", "gauge", "Newest iteration seen by the round engine", [({}, status["frontier"])]
    )
    metric("open_rounds", "gauge", "Rounds in progress at this gateway", [({}, status["open_rounds"])])
    metric(
        "stragglers",
        "gauge",
        "Links currently confirmed as stragglers",
        [({}, len(status["rates"]["stragglers"]))],
    )
    metric(
        "rate_reallocations_total",
        "counter",
        "Rate reallocations done (seed 002)",
        [({}, status["rates"]["reallocations"])],
    )
    metric(
        "trainer_connected",
        "gauge",
        "1 while this site's trainer is connected",
        [({}, int(status["trainer"]["connected"]))],
    )
    return "\n".join(lines) + "\n"
