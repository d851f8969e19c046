"""What a gateway node says about itself: the scheduler's telemetry report, ``/status``, ``/metrics`` and the
``--stats-file``. :class:`NodeReports` only reads the node's state (it changes nothing), so the node holds
the decisions and this file the rendering: what the scheduler's policies read (``link.<peer>.*`` keys,
``plan.*``, ``trainer.*``: scheduler/control/link_rate.py, the straggler policies) and what an operator and
``wanrt demo`` read (gateways.stats).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Final

from gateways.node.probe_link import probe_telemetry
from gateways.stats import peer_view, render_prometheus
from wanrt.protocol import Telemetry
from wanrt.protocol.limits import MAX_TELEMETRY_KEYS

if TYPE_CHECKING:
    from gateways.node.node import GatewayNode

__all__ = ["MAX_REPORTED_LINKS", "MAX_REPORTED_STRAGGLERS", "NodeReports"]

#: Links described in one telemetry report (the busiest): 12 keys each, beside ~30 others, must stay within
#: the protocol's MAX_TELEMETRY_KEYS (256) whatever the number of peers.
MAX_REPORTED_LINKS: Final = 18
#: Straggler sites of the running plan named in one report (one key each); STAR detaches a few at most.
MAX_REPORTED_STRAGGLERS: Final = 16


class NodeReports:
    """See the module docstring."""

    def __init__(self, node: GatewayNode) -> None:
        self._node = node

    def telemetry(self, now: float) -> Telemetry:
        """What this gateway reports: where it is, the decision it runs, its links and rounds."""
        node = self._node
        engine = node.engine
        sched = node.scheduler
        frontier = -1 if engine is None else engine.frontier
        m: dict[str, float] = {
            "frontier": float(frontier),
            "decision": float(sched.decision),
            "decision_late": float(sched.decision_late),
            "open_rounds": float(0 if engine is None else len(engine.open_rounds())),
            "queue_bytes": float(node.queue.stats().queued_bytes),
            "rounds_completed": float(node.stats.rounds_completed),
        }
        cu = sched.config_update
        if cu is not None:
            m["decision_effective"] = float(cu.effective_iteration)
            for k, v in cu.values.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    m[f"cfg.{k}"] = float(v)
        spec = sched.plan_spec
        if spec is not None:  # what a restarted scheduler's policy learns the running plan back from
            m["plan.parent_child"] = 1.0 if spec.kind == "parent_child" else 0.0
            for s in spec.stragglers[:MAX_REPORTED_STRAGGLERS]:
                m[f"plan.straggler.{s}"] = 1.0
            if spec.t_w_s is not None:
                m["plan.t_w_s"] = float(spec.t_w_s)
            if spec.x_order:
                m["plan.x_order"] = float(spec.x_order)
        trainer = node.trainer
        if trainer.iteration >= 0:
            m["trainer.iteration"] = float(trainer.iteration)
            for k, v in trainer.metrics.items():
                m[f"trainer.{k}"] = float(v)
        self._links(m)
        excess = len(m) - MAX_TELEMETRY_KEYS
        if excess > 0:  # a big plan and many links: per-rank times go first, the fastest ranks' first
            ranks = sorted((k for k in m if k.startswith("trainer.rank.")), key=lambda k: (m[k], k))
            for k in ranks[:excess]:
                del m[k]
        return Telemetry(node.site, max(frontier, 0), m)

    def _links(self, m: dict[str, float]) -> None:
        """The busiest links' keys: what the scheduler's link-rate estimate reads."""
        node = self._node
        snap = node.allocator.snapshot()
        rates = node.allocator.rates()
        link_times = node.link_times
        busiest = sorted(node.stats.peers.items(), key=lambda kv: -kv[1].counters.bytes_sent)
        for peer, st in busiest[:MAX_REPORTED_LINKS]:  # the protocol bounds a report's keys
            if peer not in rates:
                continue  # links = "plan": a peer lost before it ever linked has no link state
            m[f"link.{peer}.bytes_sent"] = float(st.counters.bytes_sent)
            m[f"link.{peer}.rate_bps"] = float(rates[peer])
            last = snap.links[peer].last_time_s
            if last is not None:
                m[f"link.{peer}.time_s"] = float(last)
            busy = link_times.busy_s.get(peer)
            if busy is not None:  # the scheduler's link rate while sending (scheduler/control/link_rate.py)
                m[f"link.{peer}.busy_s"] = busy
                m[f"link.{peer}.busy_bytes"] = float(link_times.busy_bytes.get(peer, 0))
                peak = link_times.peak_bps.get(peer)
                if peak is not None:
                    m[f"link.{peer}.peak_bps"] = float(peak)
            backlog = link_times.backlog_s.get(peer)
            if backlog is not None:  # delivery while backlogged (scheduler/control/link_rate.py)
                m[f"link.{peer}.backlog_s"] = backlog
                m[f"link.{peer}.backlog_bytes"] = float(link_times.backlog_bytes.get(peer, 0))
            rx = node.rx_rates.get(peer)
            if rx is not None and (rx.samples or rx.fast):  # the peer → us direction at this receiver
                m[f"link.{peer}.rx_bytes"] = float(rx.rx_bytes)
                m[f"link.{peer}.rx_s"] = rx.rx_s
                m[f"link.{peer}.rx_n"] = float(rx.samples)
                m[f"link.{peer}.rx_fast"] = float(rx.fast)
            probe_telemetry(node.probes, peer, m, MAX_TELEMETRY_KEYS - len(m))

    def status(self) -> dict[str, Any]:
        """``/status``: the node's state for an operator (and the tests)."""
        node = self._node
        engine = node.engine
        ledger = node.ledger
        model = node.model
        restart = node.restart
        snap = node.allocator.snapshot()
        queue = node.queue.stats()
        live = set() if engine is None else set(engine.live)
        queues = queue.peers
        peers = {
            p: peer_view(st, snap.links[p], queues.get(p), live=p in live, t0=node.t0)
            for p, st in node.stats.peers.items()
            if p in snap.links  # links = "plan": only peers that linked have link state
        }
        return {
            "site": node.site,
            "job": node.job,
            "state": node.state,
            "frontier": -1 if engine is None else engine.frontier,
            "join_at": node.join_at,
            "open_rounds": 0 if engine is None else len(engine.open_rounds()),
            "live": sorted(live),
            "missing_rounds": dict(sorted(node.stats.missing_streak.items())),
            "peers": peers,
            "queue": {"items": queue.queued_items, "bytes": queue.queued_bytes},
            "rates": {
                "iteration": snap.iteration,
                "median_s": snap.median_s,
                "last_action": snap.last_action,
                "reallocations": snap.reallocations,
                "stragglers": snap.stragglers,
            },
            "recent_rounds": list(node.stats.recent),
            "engine": {} if engine is None else asdict(engine.stats),
            "trainer": {
                "connected": node.trainer.session is not None,
                "ledger": {} if ledger is None else asdict(ledger.stats),
                "retained_aggregates": 0 if ledger is None else len(ledger.unacked_aggregates()),
            },
            "model": {
                "site": None if model.current is None else model.current.site,
                "established": model.established,
                "conflicts": [list(c) for c in model.conflicts[-8:]],
            },
            "faults": node.faults.status(),
            "resync": {"need": node.resync.need, **asdict(node.resync.stats)},
            "trainer_run": node.runs.status(),
            "restart": {
                "order": None if restart.order is None else asdict(restart.order),
                "replaced": restart.replaced,
            },
            "counters": node.stats.counters(),
        }

    def metrics_text(self) -> str:
        """``/metrics``: the status in Prometheus text format."""
        return render_prometheus(self.status())

    def stats_file(self) -> dict[str, Any]:
        """What ``--stats-file`` holds (keys read by ``wanrt demo``; see gateways.stats)."""
        node = self._node
        out = node.stats.counters()
        out["frontier"] = -1 if node.engine is None else node.engine.frontier
        out["rate_reallocations"] = node.allocator.reallocations
        out["engine"] = {} if node.engine is None else asdict(node.engine.stats)
        return out
