"""The scheduler as one sans-IO object: gateway reports in, decisions out, each with one job-wide
effective iteration.

Why two phases (see :mod:`wanrt.protocol.scheduler.messages`): a decision forwarded to one site's trainers
for iteration E
while another site's trainers have already passed E would make the sites train under different settings
from then on. So the scheduler first asks every connected gateway whether E is still ahead of its trainers
(prepare), commits only if all say yes, and otherwise aborts and prepares again further ahead under a new
id. E is the newest frontier any gateway reported plus ``announce_margin`` iterations.

Why it is not a single point of failure: gateways keep training with the last committed decision while the
scheduler is away, and report which decision they run. A scheduler that (re)starts decides nothing until
every connected gateway has reported once; it then adopts the newest decision the gateways run (and numbers
its own after it), so a restart never moves the job backwards.

What decides the values is a :class:`DecisionPolicy` (StellaTrain §4.1's controller: throughput fit,
bandwidth estimate, configuration search — :mod:`scheduler.control`); manual changes (``POST /config``)
come in through :meth:`SchedulerNode.request` and travel the same two phases. A manual value *holds*: the
policy's later decisions keep it (and leave out its per-site variants ``key@site``) until the operator
releases it (:meth:`SchedulerNode.release`); ``/status`` ``control`` says which is in force. Before, the
adaptive policy silently replaced a manual change a few seconds later (issue 21).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias

from gateways.wire.config_update import trainer_config_update
from scheduler.daemon_config import SchedulerDaemonConfig
from scheduler.sharding.service import ShardService
from wanrt.errors import ConfigError, RemoteProtocolError
from wanrt.live_settings import RESTART_KEY, parse_site_costs, parse_stragglers
from wanrt.protocol import Message, Telemetry
from wanrt.protocol.scheduler.messages import (
    RESTART_PREFIX,
    Announce,
    AnnounceReply,
    SiteShardDone,
    SiteShardGrant,
    SiteShardRelease,
    SiteShardRequest,
    check_site_keys,
    site_values,
)

__all__ = ["Decision", "DecisionPolicy", "FixedPolicy", "SchedulerNode", "SendTo"]

log = logging.getLogger("scheduler.node")

#: Telemetry keys a gateway reports about the decision it runs (the rest go to the policy).
DECISION_KEY = "decision"
EFFECTIVE_KEY = "decision_effective"
FRONTIER_KEY = "frontier"
VALUE_PREFIX = "cfg."
#: Refused prepares of the same values before they are given up: only refusals that name a problem with
#: the values (a plan naming a site a gateway does not know) count — one that came too late is prepared
#: again further ahead as often as needed.
MAX_REFUSALS = 3
#: Committed KILL_RESTART orders ``/status`` lists (the decisions file keeps every one).
MAX_RESTARTS_KEPT = 32


class DecisionPolicy(Protocol):
    """What decides the job's settings from the gateways' reports (sans-IO, time passed in)."""

    def observe(self, site: str, metrics: Mapping[str, float], now: float) -> None: ...

    def decide(self, now: float) -> dict[str, Any] | None:
        """New trainer settings (keys of :data:`wanrt.live_settings.LIVE_KEYS`, per-site batch sizes as
        ``batch_size@<site>``), or None to keep the current ones."""
        ...

    def committed(self, values: Mapping[str, Any], effective_iteration: int) -> None:
        """Every connected gateway committed ``values`` from ``effective_iteration`` on."""
        ...


class FixedPolicy:
    """No adaptation: the settings change only by :meth:`SchedulerNode.request` (``policy = "fixed"``)."""

    def observe(self, site: str, metrics: Mapping[str, float], now: float) -> None:
        return None

    def decide(self, now: float) -> dict[str, Any] | None:
        return None

    def committed(self, values: Mapping[str, Any], effective_iteration: int) -> None:
        return None


@dataclass(frozen=True, slots=True)
class Decision:
    id: int
    effective_iteration: int
    values: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SendTo:
    """Send ``msg`` to site ``site``'s gateway (if connected)."""

    site: str
    msg: Message


Action: TypeAlias = SendTo


@dataclass(slots=True)
class _Gateway:
    connected: bool = False
    reported: bool = False  # has sent telemetry since it (re)connected
    frontier: int = -1
    decision: int = 0  # the decision it runs
    last_report: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class _Pending:
    decision: Decision
    waiting: set[str]
    since: float
    source: str  # "policy" | "request"


@dataclass(slots=True)
class SchedulerStats:
    decisions_committed: int = 0
    decisions_aborted: int = 0
    reports: int = 0
    late_commits: int = 0  # gateways that reported a commit arriving after its iteration


class SchedulerNode:
    """See the module docstring."""

    def __init__(
        self, cfg: SchedulerDaemonConfig, now: float, *, policy: DecisionPolicy | None = None
    ) -> None:
        self.cfg = cfg
        self.policy: DecisionPolicy = policy or FixedPolicy()
        self.gateways: dict[str, _Gateway] = {s: _Gateway() for s in cfg.sites}
        self.current: Decision | None = None
        self.pending: _Pending | None = None
        self._queued: tuple[dict[str, Any], str] | None = None  # wanted while another is pending
        self._next_id = 1
        self._refusals = 0  # consecutive refused prepares of the same values (see MAX_REFUSALS)
        self._next_decide = now + cfg.decide_interval_s
        self._out: list[Action] = []
        self.stats = SchedulerStats()
        self.t0 = now
        #: the job's data shards (AntDT §IV-C); the daemon swaps in one restored from its state file
        self.shards = ShardService(cfg.sharding)
        #: KILL_RESTART orders committed (AntDT §V-E3), newest last, for ``/status`` (bounded)
        self.restarts: deque[dict[str, Any]] = deque(maxlen=MAX_RESTARTS_KEPT)
        #: values set by hand (``POST /config``) that the policy may not change until released
        self.held: dict[str, Any] = {}

    # -- driving ---------------------------------------------------------------------------------------

    def pop_actions(self) -> list[Action]:
        out, self._out = self._out, []
        return out

    def next_deadline(self) -> float | None:
        due = [self._next_decide]
        lease = self.shards.next_deadline()
        if lease is not None:
            due.append(lease)
        if self.pending is not None:
            due.append(self.pending.since + self.cfg.reply_timeout_s)
        return min(due)

    def tick(self, now: float) -> None:
        if self.shards.expire(now):
            log.warning("shard leases expired: their shards go back to TODO")
        pending = self.pending
        if pending is not None and now >= pending.since + self.cfg.reply_timeout_s:
            log.warning(
                "decision %d: no reply from %s within %g s; aborting it",
                pending.decision.id,
                ", ".join(sorted(pending.waiting)),
                self.cfg.reply_timeout_s,
            )
            self._abort(now, retry=True)
        if now >= self._next_decide:
            self._next_decide = now + self.cfg.decide_interval_s
            if self._ready():
                values = self.policy.decide(now)
                if values is not None:
                    values = self._with_held(values)
                if values is not None and (self.current is None or values != self.current.values):
                    self._want(values, "policy", now)

    def _with_held(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The policy's values with every held manual value kept: a held ``key`` also drops the policy's
        per-site ``key@site`` (the operator set it for every site)."""
        out = {k: v for k, v in values.items() if k.split("@", 1)[0] not in self.held and k not in self.held}
        out.update(self.held)
        return out

    def _ready(self) -> bool:
        """Decide only once every connected gateway has told us where the job is (resume after restart)."""
        connected = [g for g in self.gateways.values() if g.connected]
        return bool(connected) and all(g.reported for g in connected)

    # -- gateways ------------------------------------------------------------------------------------

    def gateway_problem(self, site: str) -> str | None:
        """Why a connecting gateway is refused (None: accept)."""
        if site not in self.gateways:
            return f"site {site!r} is not in job {self.cfg.job!r}"
        return None

    def gateway_up(self, site: str, now: float) -> None:
        g = self.gateways[site]
        g.connected, g.reported = True, False
        log.info("gateway %s connected", site)
        if self.current is not None:  # it may have missed the commit while away
            self._send(site, self.current, "commit")

    def gateway_down(self, site: str, now: float) -> None:
        g = self.gateways.get(site)
        if g is None:
            return
        g.connected = False
        log.info("gateway %s disconnected", site)
        pending = self.pending
        if pending is not None and site in pending.waiting:
            pending.waiting.discard(site)  # it gets the commit when it comes back
            self._maybe_commit(now)

    def on_message(self, site: str, msg: Message, now: float) -> None:
        """A message from site ``site``'s gateway (RemoteProtocolError: close that connection)."""
        if isinstance(msg, Telemetry):
            self._on_telemetry(site, msg, now)
        elif isinstance(msg, AnnounceReply):
            self._on_reply(site, msg, now)
        elif isinstance(msg, (SiteShardRequest, SiteShardDone, SiteShardRelease)):
            self._on_shards(site, msg, now)
        else:
            raise RemoteProtocolError(f"a gateway may not send {type(msg).__name__} here", peer=site)

    def _on_telemetry(self, site: str, msg: Telemetry, now: float) -> None:
        if msg.site != site:
            raise RemoteProtocolError("telemetry names another site", peer=site, value=msg.site)
        g = self.gateways[site]
        m = msg.metrics
        g.frontier = max(g.frontier, int(m.get(FRONTIER_KEY, -1)))
        g.last_report, g.metrics = now, dict(m)
        g.reported = True
        self.stats.reports += 1
        runs = int(m.get(DECISION_KEY, 0))
        g.decision = runs
        if m.get("decision_late", 0) > 0:
            self.stats.late_commits += 1
        if runs >= self._next_id:  # a decision from before our restart: the job runs it, adopt it
            values = {k[len(VALUE_PREFIX) :]: _scalar(v) for k, v in m.items() if k.startswith(VALUE_PREFIX)}
            self._next_id = runs + 1
            if values:
                self.current = Decision(runs, int(m.get(EFFECTIVE_KEY, 0)), values)
                log.info("resuming: the job runs decision %d (%s)", runs, values)
        self.policy.observe(site, m, now)

    def _on_shards(
        self, site: str, msg: SiteShardRequest | SiteShardDone | SiteShardRelease, now: float
    ) -> None:
        """A gateway relays its trainer's shard traffic; it may speak only for its own site, and the
        service takes a DONE only from the shard's holder."""
        if msg.site != site:
            raise RemoteProtocolError("a shard message names another site", peer=site, value=msg.site)
        if isinstance(msg, SiteShardRequest):
            g = self.shards.request(
                site,
                msg.rank,
                epoch=msg.epoch,
                dataset_len=msg.dataset_len,
                want=msg.want,
                fresh=msg.fresh,
                now=now,
            )
            self._out.append(
                SendTo(site, SiteShardGrant(site, msg.rank, msg.request, g.epoch, g.status, g.shards))
            )
        elif isinstance(msg, SiteShardDone):
            self.shards.done(site, msg.rank, msg.epoch, msg.shards, now)
        else:
            n = self.shards.release(site)
            if n:
                log.info("site %s's trainer left (%s): %d shards back to TODO", site, msg.reason, n)

    def _on_reply(self, site: str, reply: AnnounceReply, now: float) -> None:
        g = self.gateways[site]
        g.frontier = max(g.frontier, reply.frontier)
        pending = self.pending
        if pending is None or reply.decision != pending.decision.id:
            return  # a late answer to an aborted decision
        if not reply.accepted:
            if not reply.problem:  # too late there: a prepare further ahead fixes that, however often
                log.info(
                    "decision %d: site %s is already at iteration %d; preparing again further ahead",
                    reply.decision,
                    site,
                    reply.frontier,
                )
                self._abort(now, retry=True)
                return
            log.warning("decision %d refused by site %s: %s", reply.decision, site, reply.problem)
            self._refusals += 1
            give_up = self._refusals >= MAX_REFUSALS
            if give_up:
                log.error("decision %d refused %d times; giving it up", reply.decision, self._refusals)
                self._refusals = 0
            self._abort(now, retry=not give_up)
            return
        pending.waiting.discard(site)
        self._maybe_commit(now)

    # -- decisions -------------------------------------------------------------------------------------

    def request(self, values: Mapping[str, Any], now: float) -> dict[str, Any]:
        """A manual change (``POST /config``, authenticated by the service): validated by the trainers'
        schema, then announced like any decision. Returns what was done."""
        restart = [k for k in values if k == RESTART_KEY or k.startswith(RESTART_PREFIX)]
        if restart:  # AntDT §V-E3: KILL_RESTART is the straggler policy's order, not an operator's setting
            raise ConfigError(
                f"{restart[0]}: a restart is ordered by the scheduler's straggler policy only", key=restart[0]
            )
        check_site_keys(values)  # lr_scale@<site> (job-wide) or density@<site>: never silently dropped
        for site in self.gateways:
            trainer_config_update(site_values(values, site), 0)  # ConfigError naming the bad key
        unknown = [k for k in values if "@" in k and k.split("@", 1)[1] not in self.gateways]
        stragglers = values.get("stragglers")
        if isinstance(stragglers, str) and any(s not in self.gateways for s in parse_stragglers(stragglers)):
            raise ConfigError(f"stragglers: {stragglers!r} names a site not in this job", key="stragglers")
        costs = values.get("site_costs")
        if isinstance(costs, str) and any(s not in self.gateways for s in parse_site_costs(costs)):
            raise ConfigError(f"site_costs: {costs[:80]!r} names a site not in this job", key="site_costs")
        if unknown:
            raise ConfigError(f"{unknown[0]}: no such site in this job", key=unknown[0])
        self.held.update(values)
        self._want(dict(values), "request", now)
        p = self.pending
        return {
            "values": dict(values),
            "decision": None if p is None else p.decision.id,
            "effective_iteration": None if p is None else p.decision.effective_iteration,
            "state": "preparing" if p is not None else "queued",
            **self.control_status(),
        }

    def release(self, keys: list[str] | None) -> dict[str, Any]:
        """Hand held manual values back to the policy (``keys``: those; None: all); a key that is not
        held is refused with the ones that are."""
        names = list(self.held) if keys is None else keys
        missing = [k for k in names if k not in self.held]
        if missing:
            raise ConfigError(
                f"{missing[0]}: not held (held: {', '.join(sorted(self.held)) or 'none'})", key=missing[0]
            )
        for k in names:
            del self.held[k]
        log.info("manual values released: %s; %s", names, self.control_status()["mode"])
        return {"released": names, **self.control_status()}

    def control_status(self) -> dict[str, Any]:
        """Which decides now: ``manual`` (values held: the policy decides only the others), ``adaptive``
        (the policy), or ``fixed`` (no policy: settings change only by hand)."""
        if self.held:
            mode = "manual"
        elif isinstance(self.policy, FixedPolicy):
            mode = "fixed"
        else:
            mode = "adaptive"
        return {"mode": mode, "held": dict(sorted(self.held.items()))}

    def _want(self, values: dict[str, Any], source: str, now: float) -> None:
        # a restart order is one-shot: it belongs to the decision that made it, never to the next one
        carried = {} if self.current is None else self.current.values
        merged = {k: v for k, v in carried.items() if not k.startswith(RESTART_PREFIX)}
        merged.update(values)
        if self.pending is not None:
            self._queued = (merged, source)  # the newest wish wins once the pending one is settled
            return
        connected = sorted(s for s, g in self.gateways.items() if g.connected)
        if not connected:
            self._queued = (merged, source)
            return
        frontier = max(g.frontier for g in self.gateways.values())
        decision = Decision(self._next_id, frontier + self.cfg.announce_margin, merged)
        self._next_id += 1
        self.pending = _Pending(decision, set(connected), now, source)
        log.info(
            "decision %d (%s): %s from iteration %d",
            decision.id,
            source,
            merged,
            decision.effective_iteration,
        )
        for site in connected:
            self._send(site, decision, "prepare")

    def _maybe_commit(self, now: float) -> None:
        pending = self.pending
        if pending is None or pending.waiting:
            return
        self.pending = None
        self._refusals = 0
        self.current = pending.decision
        self.stats.decisions_committed += 1
        for key, rank in pending.decision.values.items():
            if key.startswith(RESTART_PREFIX):
                site = key[len(RESTART_PREFIX) :]
                d = pending.decision
                self.restarts.append(
                    {
                        "site": site,
                        "rank": rank,
                        "decision": d.id,
                        "effective_iteration": d.effective_iteration,
                    }
                )
                log.warning(
                    "decision %d: KILL_RESTART of site %s rank %s at iteration %d",
                    d.id,
                    site,
                    rank,
                    d.effective_iteration,
                )
        self.policy.committed(pending.decision.values, pending.decision.effective_iteration)
        for site, g in self.gateways.items():
            if g.connected:
                self._send(site, pending.decision, "commit")
        self._after_settled(now)

    def _abort(self, now: float, *, retry: bool) -> None:
        pending = self.pending
        if pending is None:
            return
        self.pending = None
        self.stats.decisions_aborted += 1
        for site, g in self.gateways.items():
            if g.connected:
                self._send(site, pending.decision, "abort")
        if retry and self._queued is None:
            self._queued = (pending.decision.values, pending.source)
        self._after_settled(now)

    def _after_settled(self, now: float) -> None:
        if self._queued is not None:
            values, source = self._queued
            self._queued = None
            if self.current is None or values != self.current.values:
                self._want(values, source, now)

    def _send(self, site: str, d: Decision, phase: str) -> None:
        self._out.append(SendTo(site, Announce(d.id, phase, d.effective_iteration, dict(d.values))))

    # -- views ---------------------------------------------------------------------------------------

    def status(self, now: float) -> dict[str, Any]:
        cur, p = self.current, self.pending
        return {
            "job": self.cfg.job,
            "current": None
            if cur is None
            else {"decision": cur.id, "effective_iteration": cur.effective_iteration, "values": cur.values},
            "pending": None
            if p is None
            else {
                "decision": p.decision.id,
                "effective_iteration": p.decision.effective_iteration,
                "values": p.decision.values,
                "waiting_for": sorted(p.waiting),
            },
            "gateways": {
                s: {
                    "connected": g.connected,
                    "frontier": g.frontier,
                    "decision": g.decision,
                    "last_report_s": None if g.last_report is None else round(now - g.last_report, 3),
                }
                for s, g in sorted(self.gateways.items())
            },
            "stats": {
                "decisions_committed": self.stats.decisions_committed,
                "decisions_aborted": self.stats.decisions_aborted,
                "reports": self.stats.reports,
                "late_commits": self.stats.late_commits,
            },
            "shards": self.shards.status(),
            "restarts": list(self.restarts),
            "control": self.control_status(),
        }


def _scalar(v: float) -> int | float:
    return int(v) if float(v).is_integer() else float(v)
