"""One site's gateway as a sans-IO object: events in, with the time as an argument; actions out.

The h11 ``Connection`` idea at gateway scale. :class:`GatewayNode` composes every decision a gateway makes:

* :class:`~gateways.rounds.engine.RoundEngine` — every WAN round (what to send to whom, when a round is
  finished, what is carried);
* :class:`~gateways.sending.edf_queue.SendQueue` and one :class:`~gateways.node.peer_channel.PeerChannel`
  per link — which bytes leave next (EDF by (iteration, layer)), paced at the rate the
  :class:`~gateways.sending.rate_allocator.RateAllocator` sets from :mod:`gateways.sending.link_times`;
* :mod:`gateways.membership.joining` — from which iteration a (re)joining gateway takes part, who is lost
  (a link down, a member that never links, a peer silent past the heartbeat timeout, a backlog past
  :data:`MAX_BACKLOG`);
* :mod:`gateways.membership.job_model` — which model signature is the job's;
* :mod:`gateways.membership.trainer_ledger` — which trainer pushes are counted, what a reconnecting
  trainer is owed;
* configuration updates for the trainers and their effective iteration.

Whoever drives it — :class:`~gateways.service.daemon.GatewayDaemon` over sockets and an event loop, or the
simulator in :mod:`sims` on virtual time — feeds it received bytes and trainer messages, asks it what to
write on each link (:meth:`GatewayNode.poll_link`), carries out :meth:`GatewayNode.pop_actions`, and calls
:meth:`GatewayNode.tick` at :meth:`GatewayNode.next_deadline`. Because both drivers run this same object, a
simulated gateway makes exactly the decisions a real one makes.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from collections import deque
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, Final

from gateways.config import GatewayConfig
from gateways.membership.job_model import JobModelState, ModelSignature
from gateways.membership.joining import LinkInfo, initial_live, join_iteration, lost_on_suspect, rounds_digest
from gateways.membership.site_faults import SiteFaults
from gateways.membership.trainer_ledger import TrainerLedger
from gateways.node.actions import CloseLink, NodeAction, RefuseTrainer, ToScheduler, ToTrainer, Wake
from gateways.node.peer_channel import PeerChannel, SendOut
from gateways.node.plan_values import plan_problem, plan_spec
from gateways.node.push_stream import PushStreams
from gateways.node.resync import ParamResync, ToPeer, ToSiteTrainer
from gateways.node.shard_relay import ShardRelay
from gateways.node.trainer_restart import TrainerRestart
from gateways.node.trainer_runs import RunVerdict, TrainerRuns, resume_at_of
from gateways.rounds.actions import Action, Deliver, PeerSuspect, RoundClosed, Send
from gateways.rounds.engine import RoundEngine
from gateways.rounds.topology import PlanSpec, build_plan
from gateways.sending.edf_queue import make_send_queue
from gateways.sending.link_times import LinkTimes
from gateways.sending.pacer import Pacer
from gateways.sending.rate_allocator import RateAllocator
from gateways.sending.rx_dispersion import RxDispersion
from gateways.stats import GatewayStats, peer_view, render_prometheus
from gateways.wire.config_update import trainer_config_update
from wanrt.errors import (
    AuthError,
    ConfigError,
    LocalProtocolError,
    MalformedPayload,
    ProtocolError,
    RemoteProtocolError,
    WanrtError,
    WanrtTimeout,
)
from wanrt.live_settings import PLAN_KEYS, RESTART_FROM_KEY, RESTART_KEY, split_plan_values
from wanrt.payload import SparsePayload
from wanrt.protocol import (
    Ack,
    Aggregate,
    Bye,
    ConfigUpdate,
    Connection,
    ConnectionClosed,
    Error,
    Heartbeat,
    Hello,
    Message,
    Notice,
    ParamAnnounce,
    ParamChunk,
    ParamRefuse,
    ParamRequest,
    Push,
    PushPiece,
    Role,
    ShardDone,
    ShardRequest,
    Telemetry,
)
from wanrt.protocol.limits import MAX_RANK, MAX_TELEMETRY_KEYS
from wanrt.protocol.peer.contrib_ids import distinct_sites
from wanrt.protocol.peer.round_frames import JobModel, RoundData, RoundTag
from wanrt.protocol.peer.round_msg import RoundMsg
from wanrt.protocol.peer.site_fault import SiteFault
from wanrt.protocol.push_pieces import PUSH_CUT_KEY, push_cut_value
from wanrt.protocol.scheduler.messages import Announce, AnnounceReply, SiteShardGrant, site_values
from wanrt.rank_telemetry import parse_rank_times

__all__ = ["MAX_BACKLOG", "GatewayNode"]

log = logging.getLogger("gateways.node")

#: Round messages kept for a live peer whose link is not up yet (start-up, reconnect in progress). A peer
#: that stays away this long is declared lost and the round engine re-plans without it.
MAX_BACKLOG: Final = 4096

#: Links described in one telemetry report (the busiest): 12 keys each, beside ~30 others, must stay within
#: the protocol's MAX_TELEMETRY_KEYS (256) whatever the number of peers.
MAX_REPORTED_LINKS: Final = 18
#: Straggler sites of the running plan named in one report (one key each); STAR detaches a few at most.
MAX_REPORTED_STRAGGLERS: Final = 16


class GatewayNode:
    """See the module docstring. ``on_action`` sees every round-engine action and ``on_message`` every
    round message from a peer (telemetry, tests, benchmarks); neither may call back into the node."""

    def __init__(
        self,
        cfg: GatewayConfig,
        now: float,
        *,
        on_action: Callable[[Action], None] | None = None,
        on_message: Callable[[str, RoundMsg], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.site = cfg.site
        self.job = cfg.job
        self.sites = tuple(sorted({cfg.site, *cfg.peers}))
        self._on_action = on_action
        self._on_message = on_message
        self._rounds_digest = rounds_digest(cfg.rounds)
        self.engine: RoundEngine | None = None
        self.ledger: TrainerLedger | None = None
        self.join_at: int | None = None
        self.model = JobModelState()
        self.faults = SiteFaults(self.site)
        #: what a trainer refused in its handshake is told first (ModelMismatch naming the layer)
        self.refusal_notice: Notice | None = None
        self._trainer_auth_told = -math.inf  # when the peers last heard of a failed trainer handshake
        # per-link state is sized by the links this gateway will have: every peer in a full mesh, only the
        # plan neighbours (added as their links come up) with ``links = "plan"`` (1 000-site simulations)
        mesh = cfg.links == "all"
        self.stats = GatewayStats(self.site, list(cfg.peers) if mesh else [])
        self.queue = make_send_queue(cfg.edf)
        self.allocator = RateAllocator(
            cfg.peers if mesh else (), cfg.base_rates_bps() if mesh else {}, cfg.rates
        )
        self.link_times = LinkTimes(settle=cfg.rounds.window + 1, delivery=cfg.delivery)
        #: per peer, the peer → us link's tail-dispersion samples (gateways/sending/rx_dispersion.py)
        self.rx_rates: dict[str, RxDispersion] = {}
        self._channels: dict[int, PeerChannel] = {}
        #: channels that may have bytes to write: each queued frame adds its channel (PeerChannel.outbox),
        #: pop_actions keeps the ones still pending; every other channel has nothing to write
        self._maybe_pending: dict[int, PeerChannel] = {}
        #: two links to one peer share its EDF queue, so a frame queued through one makes both pending:
        #: from the first such link on, pop_actions looks at every link again (rare: a reconnect race)
        self._scan_all_links = False
        #: min over live channels of PeerChannel.due (None: recompute); both times only move forward, so
        #: a receive changes the min only when it moves the very channel holding it
        self._links_due: float | None = None
        self._by_peer: dict[str, PeerChannel] = {}
        self._link_ids = itertools.count(1)
        self._backlog: dict[str, list[RoundMsg]] = {}
        self._contacted: set[str] = set()
        #: changes whenever what link_info() says matters and could change (a link came up before the
        #: join, the join itself): a handshake whose info predates a change is refused and redone
        #: (gateways.service.peer_links); after the join handshakes are not serialised, as before
        self.link_epoch = 0
        #: the frontier this site had seen before a restart (the daemon's state_file): announced while
        #: fresh, so gateways restarted together resume the job past it instead of at iteration 0
        self.resume_frontier = -1
        #: until when a fresh gateway refuses to join the job from a peer that is fresh too while either
        #: of them resumes (a state file): a running peer should place them (see _fresh_pair_problem)
        self._fresh_wait_until = math.inf
        self._no_link_deadline: dict[str, float] = {}
        #: when the trainer's resent pushes that no outcome so far reached back to are carried anyway
        self._ledger_give_up: float | None = None
        self._item_ids = itertools.count(1)
        self._trainer: int | None = None  # the current trainer session
        self._streams = PushStreams()  # its streamed pushes being put together
        self._trainer_model: ModelSignature | None = None
        #: the run this gateway serves and what it does while that run's trainer is dead
        self.runs = TrainerRuns(cfg.trainer_gone_grace_s)
        self._filling = False  # empty pushes for a dead trainer are being made (no re-entry)
        self._delivered_max = -1  # the newest iteration a round result was delivered for here
        self._config_update: ConfigUpdate | None = None
        self._scheduler_up = False
        self._next_report: float | None = None
        self._prepared: dict[int, Announce] = {}  # decisions announced, not committed yet (bounded)
        self._decision = 0  # the committed decision this site runs
        self._decision_late = 0  # its commit came after its iteration (applied as soon as possible)
        self._plan_spec: PlanSpec | None = None  # the last plan a committed decision set (None: config's)
        self._trainer_metrics: dict[str, float] = {}  # the leader's latest per-iteration measurements
        self._trainer_iteration = -1
        self._shards = ShardRelay(self.site)  # the trainer's data-shard traffic (scheduler.sharding)
        self.resync = ParamResync(self.site)  # parameter resync of a trainer that missed rounds
        self.restart = TrainerRestart()  # the scheduler's KILL_RESTART order for this site's trainer
        self._work: deque[Action] = deque()
        #: trainer push acks of results made here (this site finished the round), held until a peer has the
        #: result: see _deliver
        self._unshared: dict[tuple[int, int], tuple[tuple[int, int], ...]] = {}
        self._final_seqs: dict[str, list[tuple[int, tuple[int, int]]]] = {}  # peer -> (seq, round) sent
        self._peer_final = False  # the actions being applied come from a peer's result
        self._applying = False
        self._out: list[NodeAction] = []
        self._times_dirty = False
        self.t0 = now
        self.state = "created"

    # ------------------------------------------------------------------------------------------------
    # driving the node
    # ------------------------------------------------------------------------------------------------

    def start(self, now: float) -> None:
        """Listeners are up: a gateway without peers runs the job alone from iteration 0."""
        if not self.cfg.peers:
            self._create_engine(0, set(self.sites), now)
        t = self.cfg.timeouts
        self._fresh_wait_until = now + t.heartbeat_interval * t.heartbeat_misses
        self.state = "joining" if self.engine is None else "running"

    @property
    def joined(self) -> bool:
        return self.engine is not None

    def pop_actions(self) -> list[NodeAction]:
        """What the driver must do now; also a :class:`Wake` for every link with bytes to write."""
        out = self._out
        self._out = []
        maybe = self._maybe_pending
        if self._scan_all_links:
            for ch in self._channels.values():
                if not ch.ended and ch.pending():
                    out.append(Wake(ch.link_id))
        elif maybe:
            channels = self._channels
            # in link-id order: the order of self._channels, which the driver's writes follow; the dict
            # is shared with the channels (PeerChannel.outbox), so it is trimmed in place
            for link_id in sorted(maybe) if len(maybe) > 1 else list(maybe):
                ch = maybe[link_id]
                if channels.get(link_id) is ch and not ch.ended and ch.pending():
                    out.append(Wake(link_id))
                else:
                    del maybe[link_id]
        return out

    def next_deadline(self) -> float | None:
        """The earliest time :meth:`tick` has something to do (rounds, heartbeats, a member not linked)."""
        best = self._links_due
        if best is None and self._channels:
            t = self.cfg.timeouts
            lost_after = t.heartbeat_interval * t.heartbeat_misses
            for ch in self._channels.values():
                if not ch.ended:
                    d = ch.due(lost_after)
                    if best is None or d < best:
                        best = d
            self._links_due = best
        for d in self._no_link_deadline.values():
            if best is None or d < best:
                best = d
        if self._ledger_give_up is not None and (best is None or self._ledger_give_up < best):
            best = self._ledger_give_up
        if self._next_report is not None and (best is None or self._next_report < best):
            best = self._next_report
        retry = self.resync.retry_at
        if retry is not None and (best is None or retry < best):
            best = retry
        gone = self.runs.due()
        if gone is not None and (best is None or gone < best):
            best = gone
        if self.engine is not None:
            e = self.engine.next_deadline()
            if e is not None and (best is None or e < best):
                best = e
        return best

    def tick(self, now: float) -> None:
        """Time is ``now``: round deadlines, heartbeats, silent peers, members that never linked."""
        if self.engine is not None:
            d = self.engine.next_deadline()
            if d is not None and d <= now:
                self._apply(self.engine.tick(now), now)
        t = self.cfg.timeouts
        lost_after = t.heartbeat_interval * t.heartbeat_misses
        for ch in list(self._channels.values()):
            if ch.ended:
                continue
            silent = now - ch.last_rx
            if silent > lost_after:
                exc = WanrtTimeout(
                    f"no heartbeat from {ch.peer} for {silent:.1f} s",
                    phase="heartbeat",
                    seconds=lost_after,
                    peer=ch.peer,
                )
                self._end_link(ch, f"peer silent: {exc.message}", now, error=exc)
                continue
            if now >= ch.next_beat:
                ch.heartbeat(now)
                ch.next_beat = now + t.heartbeat_interval
        self._links_due = None  # the beats above moved it
        if self._ledger_give_up is not None and now >= self._ledger_give_up:
            self._ledger_give_up = None
            if self.ledger is not None:
                self._send_push_acks(self.ledger.give_up())
        for peer, at in list(self._no_link_deadline.items()):
            if at <= now:
                del self._no_link_deadline[peer]
                if peer not in self._by_peer and self.state == "running":
                    self._declare_lost(peer, f"no link within {lost_after:g} s of joining", now)
        if self._next_report is not None and now >= self._next_report:
            self._next_report = now + self.cfg.telemetry_interval_s
            self._out.append(ToScheduler(self.telemetry(now)))
        if self.resync.retry_at is not None and now >= self.resync.retry_at:
            self._resync_out(self.resync.retry(self._resync_candidates(), now))
        if self.runs.state == "gone" and self._trainer is None:
            self._fill_for_dead_trainer(now)
        self._observe_link_times(now)

    # ------------------------------------------------------------------------------------------------
    # lifecycle
    # ------------------------------------------------------------------------------------------------

    def begin_stop(self) -> None:
        self.state = "stopping"

    def idle(self) -> bool:
        """No round open and nothing queued for peers (the phased shutdown waits for this)."""
        if self.engine is not None and self.engine.has_open_rounds():
            return False
        return len(self.queue) == 0

    def say_goodbye(self, reason: str) -> None:
        """Phase 3 of a shutdown: Bye on every link (after what is queued for it) and to the trainer."""
        for ch in self._channels.values():
            if not ch.ended:
                ch.send_control(Bye(reason[:200]))
        if self._trainer is not None:
            self._out.append(ToTrainer(self._trainer, Bye(reason[:200])))

    def stopped(self) -> None:
        self.state = "stopped"

    # ------------------------------------------------------------------------------------------------
    # the round engine
    # ------------------------------------------------------------------------------------------------

    def _create_engine(self, start: int, live: set[str], now: float) -> None:
        rc = self.cfg.rounds
        spec = self._plan_spec or PlanSpec.make(rc.topology, arity=rc.tree_arity, root=self.cfg.root)
        plan = spec if live >= set(self.sites) else build_plan(spec, live)
        self.engine = RoundEngine(self.site, self.sites, plan, rc, start_iteration=start)
        self.ledger = TrainerLedger(self.site, start)
        self.join_at = start
        self.link_epoch += 1
        self.state = "running"
        log.info("joined job %s at iteration %d with members %s", self.job, start, ", ".join(sorted(live)))
        # a member that never links is as silent as one whose heartbeats stopped: every gateway gives it
        # the same time, so they all count it out (and in again when it comes) alike
        t = self.cfg.timeouts
        expected = live - {self.site} - set(self._by_peer)
        if self.cfg.links == "plan":  # only plan neighbours link (GatewayConfig.links; sims/ 1000-site trees)
            expected &= set(self.engine.plan_for(start).neighbours(self.site))
        for peer in sorted(expected):
            self._no_link_deadline[peer] = now + t.heartbeat_interval * t.heartbeat_misses

    def _apply(self, actions: list[Action], now: float) -> None:
        """Carry out engine actions in order (iteratively: handling one may produce more)."""
        self._work.extend(actions)
        if self._applying:
            return
        self._applying = True
        try:
            while self._work:
                action = self._work.popleft()
                if self._on_action is not None:
                    self._on_action(action)
                if isinstance(action, Send):
                    self._send_round(action.peer, action.msg, now)
                elif isinstance(action, Deliver):
                    self._deliver(action)
                elif isinstance(action, RoundClosed):
                    self._times_dirty = True
                    missing = self.stats.round_closed(action, now, self.cfg.absent_warn_after_s)
                    if self.faults.warnings:
                        self.faults.clear_warnings("trainer", set(self.stats.missing_streak))
                    for site, n in missing:
                        log.warning(
                            "rounds complete without site %s (%d in a row): is its trainer running? "
                            "The job trains on without its data (x-order); /status shows missing_rounds",
                            site,
                            n,
                        )
                        self._warn_trainer(  # the trainer hears it too, not only this gateway's log
                            site,
                            "trainer",
                            f"rounds complete without site {site} ({n} in a row): is its trainer running? "
                            "The job trains on without its data",
                            now,
                        )
                    if not action.delivered:
                        self._answer_empty(action.iteration, action.layer)
                elif isinstance(action, PeerSuspect):
                    self._suspect(action, now)
        finally:
            self._applying = False
        if self._unshared:
            waiting = {key for sent in self._final_seqs.values() for _, key in sent}
            for key in [k for k in self._unshared if k not in waiting]:
                self._send_push_acks(self._unshared.pop(key))  # sent to nobody: nobody to wait for
        self._observe_link_times(now)
        if self.runs.state == "gone" and self._trainer is None:
            self._fill_for_dead_trainer(now)

    def _fill_for_dead_trainer(self, now: float) -> None:
        """This site's trainer died: push an empty contribution for it up to the round the others wait
        for (gateways.node.trainer_runs), so the job trains on without its data instead of stalling."""
        engine, ledger = self.engine, self.ledger
        if self._filling or engine is None or ledger is None or not self.runs.proxying(now):
            return
        self._filling = True
        try:
            if self.runs.start_told():
                log.warning(
                    "the trainer of this site is gone (%s): rounds go on without this site's data (empty "
                    "contributions) until a trainer of this site starts again (it rejoins at the job's "
                    "iteration and fetches the job's parameters)",
                    self.runs.gone_reason,
                )
                fault = SiteFault(
                    self.site,
                    "trainer_gone",
                    f"the trainer of site {self.site} is gone ({self.runs.gone_reason[:160]}); the job "
                    f"trains on without site {self.site}'s data until it restarts",
                )
                for ch in self._by_peer.values():
                    ch.send_control(fault)
            for it, layer, (dense_len, block_size) in self.runs.fill(
                now, self._delivered_max, ledger.pushed_layers()
            ):
                empty = SparsePayload.empty(layer, dense_len, block_size)
                verdict = ledger.on_push(it, layer, empty)
                if verdict.push is not None:
                    self._apply(engine.local_push(*verdict.push, now), now)
        finally:
            self._filling = False

    def _send_round(self, peer: str, msg: RoundMsg, now: float) -> None:
        ch = self._by_peer.get(peer)
        if ch is not None and not ch.ended and not ch.bye_sent:
            try:
                ch.send_round(msg)
                key = (msg.iteration, msg.layer)
                if msg.kind == "final" and key in self._unshared:
                    self._final_seqs.setdefault(peer, []).append((ch.sent_seq, key))
            except ProtocolError as exc:
                log.error("cannot frame a round message for %s: %s; closing that link", peer, exc)
                self._end_link(ch, f"cannot frame a round message: {exc}", now, abort=True)
            return
        assert self.engine is not None
        if peer not in self.engine.live:
            return  # lost: the engine re-planned the round without it
        backlog = self._backlog.setdefault(peer, [])
        backlog.append(msg)
        if len(backlog) > MAX_BACKLOG:
            self._declare_lost(peer, f"no link for {MAX_BACKLOG} queued round messages", now)

    def _deliver(self, d: Deliver) -> None:
        assert self.ledger is not None
        acks = self.ledger.on_deliver(d.layer, d.sites)
        if d.payload is None:
            log.debug("round %s of layer %d has no payload at all; nothing to deliver", d.iteration, d.layer)
            return
        self.ledger.answer(d.iteration, d.layer)
        self._delivered_max = max(self._delivered_max, d.iteration)
        sites = distinct_sites(d.sites) or (self.site,)
        self._to_trainer(Aggregate(self.job, d.iteration, d.layer, 0, self.site, d.payload, sites))
        self.stats.aggregates_delivered += 1
        if acks and not self._peer_final:
            # a result made here exists nowhere else until a peer has it: if this gateway died now, the
            # others would re-run the round without this site's push, and a trainer told "counted" would
            # never re-send it (the chaos soak lost a killed root's last pushes so). The acks wait until a
            # peer acknowledged the result's frame (_release_shared); the trainer re-sends them otherwise
            key = (d.iteration, d.layer)
            self._unshared[key] = self._unshared.get(key, ()) + acks
            return
        self._send_push_acks(acks)

    def _answer_empty(self, iteration: int, layer: int) -> None:
        """Round (iteration, layer) ended here without a result: cut off from the others and settled when
        they came back, abandoned, or a push too late for its round. This site's contribution was carried
        into a later round, whose result will count it. The trainer gets an empty aggregate (attributed to
        this site), so that it never waits for a result that will not come."""
        assert self.ledger is not None
        shape = self.ledger.shape(layer)
        if shape is None or not self.ledger.answer(iteration, layer):
            return  # the trainer never pushed this layer, or already has its answer
        empty = SparsePayload.empty(layer, *shape)
        self._to_trainer(Aggregate(self.job, iteration, layer, 0, self.site, empty, (self.site,)))

    def _to_trainer(self, msg: Aggregate) -> None:
        assert self.ledger is not None
        if self._trainer is None and self.runs.empties_started:
            return  # a result of the empty pushes made for a dead trainer: nobody of that run will ask
        self.ledger.retain(msg)
        if self._trainer is not None:
            self._out.append(ToTrainer(self._trainer, msg))

    def _suspect(self, s: PeerSuspect, now: float) -> None:
        self.stats.suspects += 1
        ch = self._by_peer.get(s.peer)
        if lost_on_suspect(ch is not None and not ch.ended):
            self._declare_lost(s.peer, f"silent for {s.waited:.1f} s and no link ({s.reason})", now)
        else:
            log.info(
                "peer %s slow: round (%d, %d) waited %.1f s for it (%s); its link is up",
                s.peer,
                s.iteration,
                s.layer,
                s.waited,
                s.reason,
            )

    def _declare_lost(self, peer: str, reason: str, now: float) -> None:
        if self.engine is None or peer not in self.engine.live:
            return
        dropped = self._backlog.pop(peer, [])
        self.stats.peer_state(peer, "lost", now, reason)
        log.warning(
            "peer %s lost: %s; the round engine re-plans without it (%d unsent messages re-planned)",
            peer,
            reason,
            len(dropped),
        )
        self._apply(self.engine.peer_lost(peer, now), now)

    def set_plan(self, spec: PlanSpec, now: float, effective_iteration: int | None = None) -> None:
        """Adopt a topology from ``effective_iteration`` on (every unfinished round if None), e.g. a
        straggler re-attached under parent-child. Every gateway must be told the same spec and iteration."""
        if self.engine is None:
            raise LocalProtocolError("set_plan before this gateway joined the job")
        self._apply(self.engine.set_plan(spec, now, effective_iteration), now)

    def _observe_link_times(self, now: float) -> None:
        """Hand every iteration that can no longer change to the rate allocator, and its rates to the
        pacers (seed 002: react to the iteration that just ended, not several later)."""
        engine = self.engine
        if engine is None or not self._times_dirty:
            return
        self._times_dirty = False
        for iteration, times in self.link_times.ready(engine.oldest_open(), engine.frontier, now):
            rates = self.allocator.observe(iteration, times)
            for peer, rate in rates.items():
                ch = self._by_peer.get(peer)
                if ch is not None:
                    ch.pacer.set_rate(rate, now)

    # ------------------------------------------------------------------------------------------------
    # peer links
    # ------------------------------------------------------------------------------------------------

    def dialer_problem(self, hello: Hello) -> str | None:
        """Why a connecting gateway is refused (``None``: accept)."""
        if hello.role is not Role.GATEWAY:
            return f"this is the gateway listener of site {self.site!r}; role {hello.role} connects elsewhere"
        if hello.site not in self.cfg.peers:
            return f"site {hello.site!r} is not a peer of site {self.site!r} in this job"
        if not hello.site < self.site:
            return f"site {hello.site!r} must accept the connection: the smaller site name dials"
        return None

    def link_info(self, peer: str) -> dict[str, Any]:
        """Our handshake ``info`` for ``peer`` (the join rule uses what was sent: keep it)."""
        engine = self.engine
        join_at = self.join_at if engine is not None and peer not in self._contacted else None
        info = LinkInfo(
            frontier=self.resume_frontier if engine is None else engine.frontier,
            fresh=engine is None,
            join_at=join_at,
            live=None if engine is None else tuple(engine.live),
            low=None if engine is None else engine.oldest_unfinished(),
            joins=() if engine is None else tuple(engine.pending_joins().items()),
        ).to_info()
        info["rounds"] = self._rounds_digest
        info.update(self.model.info())
        return info

    def _check_claims(self, peer: str, other: LinkInfo) -> None:
        """A running gateway bounds what a peer's handshake may claim by what *this* site knows, never by
        the claim itself (DESIGN.md "Trust": a peer holding its own valid keys still sends only what its
        place allows). The join rule puts a joiner at max(frontiers) + 1 + a window margin, or at its
        announced ``join_at``: a claimed frontier or ``join_at`` far past this site's frontier would put a
        site that is in no plan into the rounds of iteration 10⁶ and make every trainer here answer its
        parameter request (security probe: frontier 999 987, ``join_at`` 10⁶ was accepted).

        An honest peer is at most a few windows past this frontier while this site's live members can
        finish rounds (every finished round had a quorum that overlaps them). Only a site that is cut off
        (:meth:`RoundEngine.may_be_behind`) believes a peer far ahead: the job went on without it. A peer
        *behind* this site is not bounded: a gateway that fell behind (restarted with an older state
        file, or cut off) must still be able to link to sites far ahead of it."""
        engine = self.engine
        if engine is None:
            return
        w = self.cfg.rounds.window
        slack = 4 * w + 1
        known = engine.frontier
        if other.frontier > known + slack and not engine.may_be_behind():
            raise RemoteProtocolError(
                f"site {peer} claims frontier {other.frontier}, but this site is at iteration {known} and "
                f"the job cannot have gone further than {known + slack} without it; restart that gateway",
                peer=peer,
                value=other.frontier,
            )
        if other.join_at is None:
            return
        limit = max(known, other.frontier) + slack
        if other.join_at > limit:
            raise RemoteProtocolError(
                f"site {peer} claims join_at {other.join_at} at frontier {other.frontier}, but this site is "
                f"at iteration {known} (at most {limit} is believed); restart its gateway",
                peer=peer,
                value=other.join_at,
            )

    def _fresh_pair_problem(self, mine: LinkInfo, other: LinkInfo, now: float) -> str | None:
        """Why two fresh gateways must not start the job between themselves yet (None: they may).

        Two gateways restarted together (chaos soak, kill2) reach each other first, and would join "the
        job" among themselves at their state files' frontier + a window, behind the survivors, who are
        many iterations further: their trainers then wait for rounds the others finished long ago. A
        restarted gateway takes its place from a running peer instead. Only when no running peer links
        within the time a silent peer is declared lost (the whole job restarted) do fresh ones start
        it together. A cold start (no state file: frontier -1 at both ends) is never held up."""
        if self.engine is not None or not (mine.fresh and other.fresh):
            return None
        if self.cfg.resume_at is not None:
            return None  # the whole job resumes from its trainers' checkpoint: every gateway starts there
        if max(mine.frontier, other.frontier) < 0 or now >= self._fresh_wait_until:
            return None
        return (
            "both gateways restarted; waiting for a running gateway of the job to take this gateway's "
            f"place from (at most {self._fresh_wait_until - now:.1f} s more)"
        )

    def link_up(
        self, peer: str, conn: Connection, ours: dict[str, Any], theirs: dict[str, Any], now: float
    ) -> int:
        """An authenticated link to ``peer``: returns its id. Raises RemoteProtocolError to refuse it."""
        if theirs.get("rounds") != self._rounds_digest:
            raise RemoteProtocolError(
                f"site {peer} runs different [gateway.rounds] settings; every site must use the same",
                peer=peer,
            )
        mine, other = LinkInfo.parse(ours, peer=self.site), LinkInfo.parse(theirs, peer=peer)
        self._check_claims(peer, other)
        problem = self._fresh_pair_problem(mine, other, now)
        if problem is not None:
            raise RemoteProtocolError(problem, peer=peer)
        sig = ModelSignature.from_info(theirs, site=None, peer=peer)
        # the first link to a peer starting cold (fresh, no state: frontier -1) that this site counts in
        # already (it started with every configured site live) may end before the peer brought it up too —
        # it refused the handshake after our Auth because it joined through another link meanwhile: such a
        # link is undone as if it never came up (_end_link). Any other link that ends makes the peer lost,
        # as before: a peer that linked before, or resumes from a state file, was restarted, and its join
        # iteration must be negotiated again (kept live, two gateways restarted together wedged full seed 1)
        first_contact = (
            other.fresh
            and other.frontier < 0
            and peer not in self._contacted
            and self.engine is not None
            and peer in self.engine.live
        )
        old = self._by_peer.get(peer)
        if old is not None:
            self._end_link(old, "replaced by a new connection from the same peer", now, abort=True)
        rates = self.allocator.rates()
        if peer not in rates:  # links = "plan": a neighbour's link state is made when it first links
            self.allocator.add_link(peer, self.cfg.base_rate_bps(peer))
            rates = self.allocator.rates()
        rate = rates[peer]
        ch = PeerChannel(
            next(self._link_ids),
            peer,
            conn,
            queue=self.queue,
            item_ids=self._item_ids,
            pacer=Pacer(rate, now),
            link_times=self.link_times,
            counters=self.stats.peer(peer).counters,
            now=now,
            rx=self.rx_rates.setdefault(peer, RxDispersion(self.cfg.delivery)),
        )
        ch.outbox = self._maybe_pending
        ch.heartbeat(now)  # at once: the first frame from us is what tells the peer this end is up
        ch.next_beat = now + self.cfg.timeouts.heartbeat_interval
        if not first_contact:
            ch.confirm()  # this link joins a member: its end is accounted for as before
        if peer in self._by_peer or self.queue.pending(peer):
            self._scan_all_links = True
        self._channels[ch.link_id] = ch
        self._links_due = None
        self._by_peer[peer] = ch
        self._contacted.add(peer)
        if self.engine is None:  # after the join, handshakes are not serialised (see link_epoch)
            self.link_epoch += 1
        self._no_link_deadline.pop(peer, None)
        self.stats.peer_state(peer, "up", now)
        log.info("link to gateway %s up", peer)
        if sig is not None:
            self._offer_model(sig, theirs.get("model_established") is True, source=ch)
        elif self.model.current is not None:
            ch.send_control(JobModel(self.model.info()))
        margin = self.cfg.rounds.window
        if self.engine is None:
            # the iteration from which *this* site takes part, as the peer computes it (``join_iteration``
            # with the roles swapped): the peer's own join_at says where the peer joined, not where a
            # gateway starting now may, and adopting it put restarted gateways behind the job
            start = join_iteration(other, mine, margin=margin)
            if (
                not other.fresh
                and other.low is not None
                and other.live is not None
                and self.site in other.live
            ):
                # the peer never lost this site (it started with every configured site live, or has not
                # yet noticed a crash): it counts this site in every round it has open and will not call
                # peer_joined, so J computed as for a rejoin would leave those rounds waiting for a site
                # that starts past them (a late-starting gateway stalled a 4-site tree until the round
                # deadline)
                start = max(0, min(start, other.low))
            self._create_engine(start, initial_live(self.site, peer, other, self.sites), now)
            for site, at in other.joins:  # joins the peer agreed before this engine existed
                if self.engine is not None and at > start and site in self.engine.live and site != self.site:
                    self.engine.known_join(site, at)
            if not other.fresh and start > self.resume_frontier + 1:  # missed rounds: fetch the parameters
                self._resync_out(self.resync.start(start))
            if other.fresh and self.resume_frontier >= 0 and self.ledger is not None:
                # resumed from a state file with a peer that restarted too: no survivor will say which of
                # the trainer's re-sent pushes were counted, so they are carried (at least once)
                self.ledger.nobody_knows = True
        elif peer not in self.engine.live:
            at = join_iteration(mine, other, margin=margin)
            log.info("gateway %s rejoins the job at iteration %d", peer, at)
            self._apply(self.engine.peer_joined(peer, now, at), now)
            if other.fresh:  # restarted: it will never settle the rounds it missed (RoundEngine docs)
                self._apply(self.engine.fresh_peer_joined(peer, at, now), now)
        for msg in self._backlog.pop(peer, []):
            ch.send_round(msg)
        self._resync_out(self.resync.retry(self._resync_candidates(), now))
        self._receive(ch, ch.events(), now)  # bytes that arrived with the handshake
        return ch.link_id

    def link_data(self, link_id: int, data: bytes, now: float) -> None:
        """Bytes received on link ``link_id``."""
        ch = self._channels.get(link_id)
        if ch is None or ch.ended:
            return
        links_due = self._links_due
        if links_due is not None:
            t = self.cfg.timeouts
            lost_after = t.heartbeat_interval * t.heartbeat_misses
            before = ch.due(lost_after)
            ch.last_rx = now  # what ch.receive sets first
            after = ch.due(lost_after)
            if after < links_due:
                self._links_due = after
            elif after != before and before <= links_due:
                self._links_due = None  # it held the min and moved: recompute on demand
        try:
            self._receive(ch, ch.receive(data, now), now)
        except (ProtocolError, AuthError) as exc:
            self._end_link(ch, f"protocol violation by the peer: {exc}", now, error=exc)

    def _receive(self, ch: PeerChannel, events: Any, now: float) -> None:
        try:
            for event in events:
                if not self._on_peer_event(ch, event, now):
                    return
        except (ProtocolError, AuthError) as exc:
            self._end_link(ch, f"protocol violation by the peer: {exc}", now, error=exc)
            return
        ch.flush_ack()

    def _on_peer_event(self, ch: PeerChannel, event: Message | ConnectionClosed, now: float) -> bool:
        """Handle one message from a peer; False once the link ended."""
        if ch.unconfirmed is not None and not isinstance(event, (Error, ConnectionClosed)):
            ch.confirm()
        if isinstance(event, Heartbeat):
            return True
        if type(event) is RoundData:
            self._on_round_message(ch, event, ch.on_data(event), now)
        elif isinstance(event, RoundTag):
            msg = ch.on_tag(event)
            if msg is not None:
                self._on_round_message(ch, event, msg, now)
        elif isinstance(event, (Push, Aggregate)):  # Aggregate is a Push subclass; listed for clarity
            tag, msg = ch.on_payload(event)
            self._on_round_message(ch, tag, msg, now)
        elif isinstance(event, Ack):
            self._release_shared(ch.peer, ch.acked_seq(event))
            if self.link_times.acked_through(ch.peer, ch.acked_seq(event), now):
                self._times_dirty = True
                self._observe_link_times(now)
        elif isinstance(event, JobModel):
            sig = ModelSignature.from_info(event.info, site=None, peer=ch.peer)
            if sig is None:
                raise RemoteProtocolError("JobModel without a signature", peer=ch.peer)
            self._offer_model(sig, event.info.get("model_established") is True, source=ch)
        elif isinstance(event, SiteFault):
            self._on_site_fault(ch, event, now)
        elif isinstance(event, (ParamRequest, ParamAnnounce, ParamChunk, ParamRefuse)):
            self._resync_peer(ch, event, now)
        elif isinstance(event, Bye):
            ch.send_control(Bye("bye"))
            self._end_link(ch, f"peer closed the link: {event.reason or 'no reason given'}", now)
            return False
        elif isinstance(event, Error):
            self._end_link(ch, f"peer aborted the link: {event.message}", now, by_peer=True)
            return False
        elif isinstance(event, ConnectionClosed):
            self._end_link(ch, f"connection closed ({event.reason})", now, by_peer=True)
            return False
        else:
            raise RemoteProtocolError(f"{type(event).__name__} is not used between gateways", peer=ch.peer)
        return not ch.ended

    def _on_round_message(self, ch: PeerChannel, tag: RoundTag, msg: RoundMsg, now: float) -> None:
        engine, ledger = self.engine, self.ledger
        assert engine is not None and ledger is not None  # a link is up only once the engine exists
        if self._on_message is not None:
            self._on_message(ch.peer, msg)
        if msg.payload is not None and not msg.payload.is_finite():
            msg = dataclasses.replace(msg, payload=self._non_finite(msg.payload, ch.peer))
        settled = engine.stats.settled
        if msg.kind == "outcome":
            self._send_push_acks(ledger.on_outcome(msg.layer, msg.step, msg.iteration, msg.sites))
            self._arm_give_up(now)
        self._peer_final = msg.kind in ("final", "segment_final")  # a result that exists elsewhere too
        try:
            self._apply(engine.peer_message(ch.peer, msg, now), now)
        finally:
            self._peer_final = False
        ch.taken(tag)
        if engine.stats.settled > settled:
            self._warn_trainer(
                self.site,
                "trainer",
                f"this site fell behind the job (cut off from the others): its rounds before iteration "
                f"{msg.iteration} were settled without a result here (empty aggregates; its contributions "
                "are carried into the job's next rounds) and it continues at the job's frontier; its "
                "parameters differ from the other sites' until they are resynchronised",
                now,
            )
            # past every iteration seen here: a settled round's real result is then in the snapshot (K ≥ J),
            # and nothing the trainer applied before the notice is of an iteration ≥ K
            self._resync_out(self.resync.start(engine.frontier + 1))

    def link_closed(self, link_id: int, reason: str, now: float) -> None:
        """The driver saw link ``link_id`` end (the peer went away, the transport failed)."""
        ch = self._channels.get(link_id)
        if ch is not None:
            self._end_link(ch, reason, now, notify=False, by_peer=True)
        self._channels.pop(link_id, None)

    def poll_link(self, link_id: int, now: float) -> SendOut:
        """What link ``link_id``'s writer does next (see :class:`~gateways.node.peer_channel.SendOut`)."""
        ch = self._channels.get(link_id)
        if ch is None:
            return SendOut(done=True)
        out = ch.poll(now)
        self._maybe_pending[link_id] = ch  # a frame the pacer held back is still pending
        if out.done or (ch.ended and not out.parts):
            out.done = True
        return out

    def channel(self, link_id: int) -> PeerChannel | None:
        return self._channels.get(link_id)

    def link_id_of(self, peer: str) -> int | None:
        ch = self._by_peer.get(peer)
        return None if ch is None or ch.ended else ch.link_id

    def rejected(
        self, who: str, why: str, site: str | None = None, now: float | None = None, *, kind: str = "config"
    ) -> None:
        """A connection was refused (wrong secret, other round settings, a race, a flood): counted, logged,
        and, when the peer site is known, shown as its ``reason`` in /status and told to this site's trainer
        as a warning (``kind`` "auth" or "config")."""
        self.stats.rejected_connections += 1
        log.warning("connection from %s rejected: %s", who, why)
        st = self.stats.peers.get(site) if site is not None else None
        if site is not None and st is not None and st.state != "up":
            st.reason = f"refused: {why}"
            if now is not None:
                st.since = now
            self._warn_trainer(
                site,
                kind,
                f"the link to site {site}'s gateway was refused: {why}",
                self.t0 if now is None else now,
            )

    def _release_shared(self, peer: str, seq: int | None) -> None:
        """``peer`` acknowledged our frames up to ``seq`` (None: its link ended): the results made here
        that it now has (or that only waited for it) release their trainer push acks."""
        sent = self._final_seqs.get(peer)
        if not sent:
            return
        done = [key for s, key in sent if seq is None or s <= seq]
        rest = [] if seq is None else [(s, key) for s, key in sent if s > seq]
        if rest:
            self._final_seqs[peer] = rest
        else:
            del self._final_seqs[peer]
        waiting = {key for other in self._final_seqs.values() for _, key in other}
        for key in done:
            acks = self._unshared.get(key)
            if acks is not None and (seq is not None or key not in waiting):
                del self._unshared[key]
                self._send_push_acks(acks)

    def _end_link(
        self,
        ch: PeerChannel,
        reason: str,
        now: float,
        *,
        error: WanrtError | None = None,
        abort: bool = False,
        notify: bool = True,
        by_peer: bool = False,
    ) -> None:
        """Link ``ch`` is over: tell the driver how to close it, and re-plan without it if it counted.

        The first link to a fresh peer that this site counts in already (see :meth:`link_up`), closed by
        the peer (``by_peer``: its Error, the connection ending) before it sent anything on it, does not
        make the peer lost: the peer may never have brought it up. The dialer brings its end
        up once its Auth is out, and the acceptor may still refuse the connection afterwards (another link
        came up during its handshake, the pre-join ``link_epoch`` rule). Declaring the peer lost then
        re-planned this site's open rounds alone — no other site saw a change, the partials they had sent
        here under the old plan were never sent again, and the job waited for the round deadline
        (bench_gateway's start-up stall, 1 run in 25). The peer is treated as a member that has not linked
        yet instead: what went out on the link waits for the next one, and the no-link timeout, the same
        at every site, declares it lost if none comes."""
        if ch.ended:
            return
        ch.ended = True
        self._links_due = None
        if notify:
            self._out.append(CloseLink(ch.link_id, reason, error=error, abort=abort))
        peer = ch.peer
        if self._by_peer.get(peer) is ch:
            del self._by_peer[peer]
        else:
            return  # an older link replaced by a newer one: nothing else to account for
        self.queue.cancel_peer(peer)  # the round engine re-plans what was queued (it keeps its own data)
        self._release_shared(peer, None)
        self.link_times.drop_peer(peer)
        self._resync_out(self.resync.link_ended(peer, self._resync_candidates(), now))
        if self.state in ("stopping", "stopped"):
            self.stats.peer_state(peer, "down", now, reason)
            log.info("link to %s closed: %s", peer, reason)
            return
        if self.engine is not None and peer in self.engine.live:
            unsent = ch.unconfirmed if by_peer else None
            if unsent is not None and self._never_linked(peer, unsent, reason, now):
                return
            self._declare_lost(peer, reason, now)
        else:
            self.stats.peer_state(peer, "down", now, reason)
            log.warning("link to %s down: %s", peer, reason)

    def _never_linked(self, peer: str, unsent: list[RoundMsg], reason: str, now: float) -> bool:
        """Undo a link the peer never said anything on (see :meth:`_end_link`): its round messages wait
        for the next link, the no-link timeout runs again. False (declare it lost) past MAX_BACKLOG."""
        backlog = unsent + self._backlog.get(peer, [])
        if len(backlog) > MAX_BACKLOG:
            return False
        self._backlog[peer] = backlog
        t = self.cfg.timeouts
        lost_after = t.heartbeat_interval * t.heartbeat_misses
        self._no_link_deadline.setdefault(peer, now + lost_after)
        self.stats.peer_state(peer, "down", now, reason)
        log.warning(
            "link to %s ended before the peer sent anything on it (%s): it may never have brought the link "
            "up, so it is not declared lost; %d round messages wait for the next link (lost if none "
            "within %g s)",
            peer,
            reason,
            len(backlog),
            lost_after,
        )
        return True

    def _offer_model(self, sig: ModelSignature, established: bool, *, source: PeerChannel | None) -> None:
        before = self.model.current
        outcome = self.model.offer(sig, established=established)
        cur = self.model.current
        assert cur is not None
        if outcome == "kept" and source is not None:
            log.error(
                "site %s trains a different model than the job's (presented by site %s)", sig.site, cur.site
            )
            source.send_control(JobModel(self.model.info()))
        if outcome in ("adopted", "replaced") or (before is not None and before.site != cur.site):
            if outcome == "replaced":
                log.error(
                    "the job's model is site %s's; site %s's model differs", cur.site, before and before.site
                )
            for ch in self._by_peer.values():
                if ch is not source:
                    ch.send_control(JobModel(self.model.info()))
        if (
            self._trainer is not None
            and self._trainer_model is not None
            and not cur.same_model(self._trainer_model)
        ):
            log.error("this site's trainer runs a different model than the job's; closing its connection")
            problem = f"this site's model differs from the job's model (as trained by site {cur.site})"
            self._own_model_fault(self._trainer_model, cur)
            # the job's signature lets the trainer name the first differing layer (ModelMismatch)
            self._out.append(
                ToTrainer(self._trainer, Notice(self.site, "model", problem, True, self.model.info()))
            )
            self._out.append(RefuseTrainer(self._trainer, problem))

    # ------------------------------------------------------------------------------------------------
    # site faults (gateways.membership.site_faults)
    # ------------------------------------------------------------------------------------------------

    def _own_model_fault(self, sig: ModelSignature, job: ModelSignature) -> None:
        """This site's trainer presented another model than the job's: every other site hears of it."""
        fault = SiteFault(
            self.site,
            "model",
            f"site {self.site}'s trainer runs a different model than the job's (trained by site {job.site})",
            sig.info(established=False),
        )
        if self.faults.own(fault):
            for ch in self._by_peer.values():
                ch.send_control(fault)

    def trainer_auth_failed(self, reason: str, now: float) -> None:
        """A connection to this site's trainer socket failed to authenticate: the other sites' trainers,
        which would wait for this site, hear of it as a warning (at most once per 30 s)."""
        if now - self._trainer_auth_told < 30.0:
            return
        self._trainer_auth_told = now
        fault = SiteFault(
            self.site,
            "trainer_auth",
            f"a trainer of site {self.site} failed to authenticate with its gateway ({reason[:200]}); "
            "check its secret_file",
        )
        for ch in self._by_peer.values():
            ch.send_control(fault)

    def _on_site_fault(self, ch: PeerChannel, fault: SiteFault, now: float) -> None:
        if fault.kind in ("trainer_auth", "trainer_gone"):  # warnings, only from that site itself
            if fault.site == ch.peer:
                if fault.kind == "trainer_gone":
                    log.warning("site %s reports: %s", fault.site, fault.message)
                kind = "auth" if fault.kind == "trainer_auth" else "trainer"  # Notice kinds
                self._warn_trainer(fault.site, kind, fault.message, now)
            return
        live = {p for p, c in self._by_peer.items() if not c.ended}
        # fatal while the job is starting *for that site*: this gateway has run no round yet, or none with
        # that site's contribution (the sites that started first ran rounds without it, and would wait for
        # it until their update deadline: issue 21, "one extra layer at site b" hung site a 120 s)
        starting = not self.model.established or fault.site not in self.stats.contributed
        if not self.faults.accept(fault, from_peer=ch.peer, live_peers=live, fatal=starting):
            return
        log.error("site %s reports: %s", fault.site, fault.message)
        for other in self._by_peer.values():
            if other is not ch:
                other.send_control(fault)
        if self._trainer is not None:
            self._out.append(ToTrainer(self._trainer, self.faults.notice(fault)))

    def _warn_trainer(self, site: str, kind: str, message: str, now: float) -> None:
        notice = self.faults.warn(site, kind, message, now)
        if notice is not None and self._trainer is not None:
            self._out.append(ToTrainer(self._trainer, notice))

    # ------------------------------------------------------------------------------------------------
    # the trainer
    # ------------------------------------------------------------------------------------------------

    def trainer_welcome_info(self, hello: dict[str, Any] | None = None) -> dict[str, Any]:
        """The Welcome's info for a trainer whose Hello said ``hello``: the job's model, where the job is,
        and, for a run this gateway will not serve, ``refused`` (why) and ``retry`` — so the client raises
        at ``wanrt.init`` with that one message (the decision is made again after the trainer
        authenticated: :meth:`trainer_model_problem`); for the restart of a dead run, ``restart_from``."""
        info = self.model.info()
        info["frontier"] = -1 if self.engine is None else self.engine.frontier
        info["join_at"] = -1 if self.join_at is None else self.join_at
        rc = self.cfg.rounds
        if rc.topology == "allpairs" and rc.allpairs_chunk_bytes and rc.forward_policy == "exact":
            info[PUSH_CUT_KEY] = push_cut_value(len(self.sites), rc.allpairs_chunk_bytes)  # streamed pushes
        start = self.restart.start_at(self._next_trainer_push())
        if hello is not None:
            verdict = self._run_verdict(hello)
            # the process the scheduler restarted (KILL_RESTART) is let in by the order whatever the old
            # run's state (its close() said Bye: "finished"), as _run_problem decides after the handshake
            ordered = start is not None and verdict.kind in ("replace", "refused")
            if verdict.problem is not None and not ordered:
                info["refused"] = verdict.problem[:900]
                info["retry"] = verdict.retry
            elif verdict.kind == "replace" and not ordered:
                start = self._replacement_start()
                self.runs.offered = start  # the empty pushes for the dead trainer stay below it
        if start is not None:  # read only by a replacement trainer's first connection
            info[RESTART_FROM_KEY] = start
        return info

    def trainer_model_problem(self, info: dict[str, Any]) -> str | None:
        """Why this trainer may not train here (None: fine): another run is being served, or its model is
        not the job's (its signature may be adopted)."""
        problem = self._run_problem(info)
        if problem is not None:
            return problem
        try:
            sig = ModelSignature.from_info(info, site=self.site, peer="trainer")
        except RemoteProtocolError as exc:
            return exc.message
        if sig is None:
            return None
        before = self.model.current
        outcome = self.model.offer(sig, established=False)
        if outcome == "kept":
            cur = self.model.current
            assert cur is not None
            self._own_model_fault(sig, cur)
            problem = f"this site's model differs from the job's model (as trained by site {cur.site})"
            # the job's model came after this trainer's Welcome: the notice lets it name the layer
            self.refusal_notice = Notice(self.site, "model", problem, True, self.model.info())
            return problem
        if outcome != "same" or before is None:
            for ch in self._by_peer.values():
                ch.send_control(JobModel(self.model.info()))
        self._trainer_model = sig
        return None

    def _run_verdict(self, info: dict[str, Any]) -> RunVerdict:
        frontier = -1 if self.engine is None else self.engine.frontier
        served = self.stats.trainer_pushes > 0
        return self.runs.verdict(
            info.get("run"),
            resume_at_of(info),
            None if self.ledger is None else self._next_trainer_push(),
            frontier,
            served=served,
            resync_pending=self.resync.need is not None,
            reconnect=info.get("reconnect") is True,
        )

    def _run_problem(self, info: dict[str, Any]) -> str | None:
        """Which run may train here (gateways.node.trainer_runs): a reconnect of the run served, the first
        run, the restart of a run whose trainer died (it starts at the site's next iteration and fetches
        the job's parameters and optimizer state), a checkpoint resumed where this site stopped, or the
        process the scheduler restarted (KILL_RESTART); anything else is another run: refused, saying
        what to do (its pushes would be taken for the old run's re-sends and hang)."""
        run = info.get("run")
        verdict = self._run_verdict(info)
        start = self.restart.start_at(self._next_trainer_push())
        if verdict.kind in ("replace", "refused") and start is not None and self.restart.admit():
            # the process the scheduler restarted (KILL_RESTART): the new one takes over where the old
            # one stopped (its Welcome said so) and fetches the job's parameters
            self.runs.admit(run, RunVerdict("replace"))
            self._resync_out(self.resync.start(start))
            return None
        if verdict.problem is None:
            if verdict.kind == "replace":
                start = self._replacement_start()
                log.warning(
                    "a new trainer run replaces run %s, whose trainer died (%s): it starts at iteration %d "
                    "and fetches the job's parameters and optimizer state from another site",
                    self.runs.run,
                    self.runs.gone_reason,
                    start,
                )
                if self.ledger is not None:
                    self.ledger.forget_aggregates()  # the dead run's; the resync snapshot holds them
                self._resync_out(self.resync.start(start))
            elif verdict.kind == "resume":
                log.warning(
                    "a new trainer run resumes the job from its checkpoint of iteration %d (run %s "
                    "stopped there)",
                    self.runs.stopped_at,
                    self.runs.run,
                )
            self.runs.admit(run, verdict)
            return None
        return verdict.problem

    def trainer_connected(self, session: int) -> None:
        """Trainer session ``session`` passed its handshake; it replaces any earlier one."""
        old = self._trainer
        if old is not None:
            log.warning("a new trainer connection replaces an earlier one")
            self._out.append(RefuseTrainer(old, "replaced by a new connection of this site's trainer"))
        self._trainer = session
        self.runs.connected()
        self._streams.clear()  # the old session's unfinished pushes are never counted
        self.stats.trainer_connections += 1
        # a pending resync first: the trainer must hold every result it gets from now on (one applied
        # before the notice, of an iteration the snapshot lacks, would be overwritten by the snapshot)
        self._resync_out(self.resync.trainer_connected())
        if self.ledger is not None:
            for msg in self.ledger.unacked_aggregates():
                self._out.append(ToTrainer(session, msg))
        if self._config_update is not None:
            self._out.append(ToTrainer(session, self._config_update))
        for notice in self.faults.replay():
            self._out.append(ToTrainer(session, notice))

    def trainer_disconnected(
        self, session: int, reason: str, *, clean: bool = False, now: float | None = None
    ) -> None:
        """The trainer session ended: ``clean`` when its ``close()`` said Bye (the run finished here), else
        it died (gateways.node.trainer_runs: after a grace the gateway pushes empty contributions for it,
        and the next run is its restart)."""
        if self._trainer == session:
            self._trainer = None
            self.runs.left(clean=clean, reason=reason, next_push=self._next_trainer_push(), now=now or 0.0)
            self._streams.clear()
            self._to_scheduler(self._shards.trainer_left(reason, self._scheduler_up))  # DOING → TODO
            self._resync_out(self.resync.trainer_left())
        log.info("trainer disconnected: %s", reason)

    def check_trainer_push(self, push: Push | PushPiece) -> None:
        """A push must name this job and this site (RemoteProtocolError: the trainer's connection ends)."""
        if push.job != self.job or push.sender != self.site:
            raise RemoteProtocolError(
                "push names another job or site", peer="trainer", value=(push.job, push.sender)
            )

    def trainer_push(self, session: int, push: Push, now: float) -> None:
        """A push from the trainer. Rounds start once this gateway has joined the job: the driver holds
        pushes until :attr:`joined` (flow control, so the trainer's connection backs up meanwhile)."""
        engine, ledger = self.engine, self.ledger
        if engine is None or ledger is None:
            raise LocalProtocolError("trainer push handed to the node before it joined the job")
        self.check_trainer_push(push)
        payload = push.payload
        if not payload.is_finite():
            payload = self._non_finite(payload, "trainer")
        self._take_push(session, push.iteration, push.layer, payload, now)

    def trainer_push_piece(self, session: int, piece: PushPiece, now: float) -> None:
        """A piece of a streamed push (:mod:`gateways.node.push_stream`): kept until the push is whole,
        then counted like a :class:`Push`; meanwhile offered to the engine, which may forward it at once
        if the ledger would hand the whole push over unchanged. NaN/Inf in a piece: ``reject_link`` ends
        the connection; ``drop_payload`` drops that piece's blocks (the rest of the push counts)."""
        engine, ledger = self.engine, self.ledger
        if engine is None or ledger is None:
            raise LocalProtocolError("trainer push handed to the node before it joined the job")
        self.check_trainer_push(piece)
        if session != self._trainer:
            return  # a replaced connection's last frames
        payload = piece.payload
        if not payload.is_finite():
            payload = self._non_finite(payload, "trainer")
        whole = self._streams.add(piece, payload)
        if ledger.fresh(piece.iteration, piece.layer):
            it, layer = piece.iteration, piece.layer
            self._apply(engine.local_piece(it, layer, piece.lo, piece.hi, payload, now), now)
        if whole is not None:
            self._take_push(session, piece.iteration, piece.layer, whole, now)

    def _take_push(
        self, session: int, iteration: int, layer: int, payload: SparsePayload, now: float
    ) -> None:
        engine, ledger = self.engine, self.ledger
        assert engine is not None and ledger is not None
        self.stats.trainer_pushes += 1
        verdict = ledger.on_push(iteration, layer, payload)
        if verdict.acks:
            self._send_push_acks(verdict.acks, session)
        if iteration < ledger.join_at:  # resent from before a restart: may wait for an outcome
            self._arm_give_up(now)
        if verdict.push is not None:
            it, layer, payload = verdict.push
            self._apply(engine.local_push(it, layer, payload, now), now)
            if not engine.is_open(it, layer):
                self._answer_empty(it, layer)  # carried: its round is over here (no-op if answered)
            if not self.model.established and self.model.current is not None:
                self.model.establish()

    def trainer_telemetry(self, msg: Telemetry, now: float) -> None:
        """The site leader's measurements of one iteration (bounded by the protocol: MAX_TELEMETRY_KEYS);
        kept until the next report to the scheduler, which sees them as ``trainer.<key>``."""
        if msg.site != self.site:
            raise RemoteProtocolError("telemetry names another site", peer="trainer", value=msg.site)
        world = msg.metrics.get("world_size")
        ws = int(world) if world is not None and math.isfinite(world) and 1 <= world <= MAX_RANK else None
        parse_rank_times(msg.metrics, world_size=ws, peer="trainer")  # RemoteProtocolError: ends the session
        if msg.iteration > self._trainer_iteration:
            self._trainer_iteration = msg.iteration
            self._trainer_metrics = dict(msg.metrics)

    def trainer_shards(self, session: int, msg: ShardRequest | ShardDone, now: float) -> None:
        """A shard request or DONE report of the current trainer, relayed to the scheduler under this
        site's name (:mod:`gateways.node.shard_relay`); a replaced session's are ignored."""
        if session != self._trainer:
            return
        up, down = self._shards.from_trainer(msg, self._scheduler_up)
        self._to_scheduler(up)
        self._out.extend(ToTrainer(session, m) for m in down)

    # ------------------------------------------------------------------------------------------------
    # parameter resync (gateways.node.resync: the decisions; here only routing)
    # ------------------------------------------------------------------------------------------------

    def trainer_params(
        self, session: int, msg: ParamRequest | ParamAnnounce | ParamChunk | ParamRefuse, now: float
    ) -> None:
        """A resync message of the current trainer: its own question, or its answer to a peer's."""
        if session != self._trainer:
            return
        sig = self.model.current
        n_layers = None if sig is None else sig.n_layers
        self._resync_out(self.resync.from_trainer(msg, n_layers, self._resync_candidates(), now))

    def _resync_peer(
        self, ch: PeerChannel, msg: ParamRequest | ParamAnnounce | ParamChunk | ParamRefuse, now: float
    ) -> None:
        engine = self.engine
        out = self.resync.from_peer(
            ch.peer,
            msg,
            member=engine is not None and ch.peer in engine.live,
            frontier=-1 if engine is None else engine.frontier,
            claim_margin=4 * self.cfg.rounds.window + 2,  # as far as a join may be claimed (_check_claims)
            trainer_up=self._trainer is not None and self.resync.need is None,
            candidates=self._resync_candidates(),
            now=now,
        )
        self._resync_out(out)

    def _resync_candidates(self) -> list[str]:
        """Peers that may be asked for the parameters: live members with a link, the plan's parent first."""
        engine = self.engine
        if engine is None or self.resync.need is None:
            return []
        linked = [p for p in sorted(engine.live) if p != self.site and p in self._by_peer]
        parent = engine.plan_for(self.resync.need).parent_of(self.site)
        if parent in linked:
            linked.remove(parent)
            linked.insert(0, parent)
        return linked

    def _resync_out(self, outs: list[ToPeer | ToSiteTrainer]) -> None:
        for o in outs:
            if isinstance(o, ToSiteTrainer):
                if self._trainer is not None:
                    self._out.append(ToTrainer(self._trainer, o.msg))
                continue
            ch = self._by_peer.get(o.peer)
            if ch is None or ch.ended:
                continue
            if o.bulk is not None:
                ch.send_bulk(o.msg, o.bulk)
            else:
                ch.send_control(o.msg)

    def _arm_give_up(self, now: float) -> None:
        """A resent push waits for an outcome that reaches back to it: the peers that could send one link
        within the time a silent peer is declared lost, after which it is carried (TrainerLedger.give_up)."""
        if self._ledger_give_up is None and self.ledger is not None and self.ledger.undecided():
            t = self.cfg.timeouts
            self._ledger_give_up = now + t.heartbeat_interval * t.heartbeat_misses

    def _to_scheduler(self, msgs: list[Message]) -> None:
        if self._scheduler_up:
            self._out.extend(ToScheduler(m) for m in msgs)

    def _non_finite(self, p: SparsePayload, who: str) -> SparsePayload:
        """A payload with NaN/Inf values (``non_finite`` setting): refused, or counted as empty."""
        if self.cfg.non_finite == "reject_link":
            raise MalformedPayload(f"layer {p.layer}: NaN or Inf values", peer=who, value=p.layer)
        self.stats.non_finite_dropped += 1
        log.error("layer %d from %s holds NaN or Inf values: counted as an empty contribution", p.layer, who)
        return SparsePayload.empty(p.layer, p.dense_len, p.block_size, p.value_dtype)

    def trainer_ack(self, ack: Ack) -> None:
        if self.ledger is not None:
            self.ledger.aggregate_acked(ack.iteration, ack.layer)

    def _send_push_acks(self, acks: tuple[tuple[int, int], ...], session: int | None = None) -> None:
        target = self._trainer if session is None else session
        if target is None:
            return
        for it, layer in acks:
            self._out.append(ToTrainer(target, Ack(it, layer, 0)))

    # ------------------------------------------------------------------------------------------------
    # the scheduler (wanrt.protocol.scheduler.messages: two-phase announcements, telemetry)
    # ------------------------------------------------------------------------------------------------

    def scheduler_connected(self, now: float) -> None:
        """The link to the job's scheduler is up: report at once (it resumes from what gateways say)."""
        self._scheduler_up = True
        self._next_report = now + self.cfg.telemetry_interval_s
        self._out.append(ToScheduler(self.telemetry(now)))
        self._to_scheduler(self._shards.scheduler_up())

    def scheduler_disconnected(self, now: float) -> None:
        """Training goes on with the last committed decision; prepared ones are forgotten."""
        self._scheduler_up = False
        self._next_report = None
        self._prepared.clear()

    def _safe_iteration(self) -> int:
        """The first iteration this site's trainers cannot have reached yet: they run at most ``window``
        iterations past the frontier (pushes beyond it are refused), plus one in flight."""
        frontier = -1 if self.engine is None else self.engine.frontier
        return frontier + self.cfg.rounds.window + 2

    def scheduler_message(self, msg: Message, now: float) -> None:
        """An Announce or a shard grant from the scheduler (RemoteProtocolError for anything else: the link
        ends)."""
        if isinstance(msg, SiteShardGrant):
            up, down = self._shards.from_scheduler(msg, self._trainer is not None)
            self._to_scheduler(up)
            if self._trainer is not None:
                self._out.extend(ToTrainer(self._trainer, m) for m in down)
            return
        if not isinstance(msg, Announce):
            raise RemoteProtocolError(f"the scheduler may not send {type(msg).__name__}", peer="scheduler")
        frontier = -1 if self.engine is None else self.engine.frontier
        values = site_values(msg.values, self.site)
        if msg.phase == "prepare":
            trainer_values, _ = split_plan_values(values)
            if trainer_values:
                trainer_config_update(trainer_values, msg.effective_iteration)  # shared schema (ConfigError)
            # plan settings this gateway cannot apply are refused now, so a commit is never half-applied
            problem = plan_problem(values, self.cfg.rounds, self.cfg.root, self.sites)
            problem = problem or self.restart.problem(values, self._trainer_metrics.get("world_size"))
            if problem is not None:
                log.warning("refusing decision %d: its plan cannot apply here: %s", msg.decision, problem)
            ok = (
                problem is None
                and self.engine is not None
                and msg.effective_iteration >= self._safe_iteration()
            )
            if ok:
                if len(self._prepared) >= 16:  # a scheduler that never commits: keep the newest
                    del self._prepared[min(self._prepared)]
                self._prepared[msg.decision] = msg
            self._out.append(ToScheduler(AnnounceReply(msg.decision, ok, frontier, problem or "")))
        elif msg.phase == "abort":
            self._prepared.pop(msg.decision, None)
        else:  # commit (also the current decision re-sent to a gateway that reconnects)
            self._prepared.pop(msg.decision, None)
            if msg.decision <= self._decision:
                return  # already running it (or a newer one)
            effective = msg.effective_iteration
            safe = self._safe_iteration()
            if effective < safe and self.engine is not None and effective <= frontier + 1:
                log.warning(
                    "decision %d arrived after its iteration %d (frontier %d); applied from %d",
                    msg.decision,
                    effective,
                    frontier,
                    safe,
                )
                self._decision_late += 1
                effective = safe
            self._decision = msg.decision
            # the plan from the decision's own iteration even when the commit came late: rounds already
            # finished keep theirs, unfinished ones re-plan, so this gateway agrees with the others
            self._commit_plan(msg.decision, values, msg.effective_iteration, now)
            trainer_values, _ = split_plan_values(values)
            if trainer_values:
                # a restart order goes to the trainer connected now, once; later sessions get the rest
                keep = self.restart.committed(msg.decision, trainer_values, msg.effective_iteration)
                self._forward_config(trainer_values, effective, keep)

    def _commit_plan(self, decision: int, values: dict[str, Any], effective: int, now: float) -> None:
        """STAR §IV-B: the decision's plan (e.g. parent–child with its straggler sites and t_w) governs
        every round from ``effective`` on — the same spec and iteration at every gateway."""
        try:
            spec = plan_spec(values, self.cfg.rounds, self.cfg.root, self.sites)
        except ConfigError as e:  # a commit re-sent on reconnect without a prepare this gateway checked
            log.error("decision %d: its plan cannot apply here (%s); keeping the current plan", decision, e)
            return
        if spec is None or spec == self._plan_spec:
            return  # later decisions carry the plan on unchanged: nothing to re-plan
        self._plan_spec = spec
        log.info(
            "decision %d: plan %s (stragglers %s, t_w %s) from iteration %d",
            decision,
            spec.kind,
            ",".join(spec.stragglers) or "none",
            "default" if spec.t_w_s is None else f"{spec.t_w_s:g} s",
            effective,
        )
        if self.engine is not None:  # not joined yet: _create_engine starts with it
            self.set_plan(spec, now, effective)

    def telemetry(self, now: float) -> Telemetry:
        """What this gateway reports: where it is, the decision it runs, its links and rounds."""
        engine = self.engine
        frontier = -1 if engine is None else engine.frontier
        m: dict[str, float] = {
            "frontier": float(frontier),
            "decision": float(self._decision),
            "decision_late": float(self._decision_late),
            "open_rounds": float(0 if engine is None else len(engine.open_rounds())),
            "queue_bytes": float(self.queue.stats().queued_bytes),
            "rounds_completed": float(self.stats.rounds_completed),
        }
        cu = self._config_update
        if cu is not None:
            m["decision_effective"] = float(cu.effective_iteration)
            for k, v in cu.values.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    m[f"cfg.{k}"] = float(v)
        spec = self._plan_spec
        if spec is not None:  # what a restarted scheduler's policy learns the running plan back from
            m["plan.parent_child"] = 1.0 if spec.kind == "parent_child" else 0.0
            for s in spec.stragglers[:MAX_REPORTED_STRAGGLERS]:
                m[f"plan.straggler.{s}"] = 1.0
            if spec.t_w_s is not None:
                m["plan.t_w_s"] = float(spec.t_w_s)
            if spec.x_order:
                m["plan.x_order"] = float(spec.x_order)
        if self._trainer_iteration >= 0:
            m["trainer.iteration"] = float(self._trainer_iteration)
            for k, v in self._trainer_metrics.items():
                m[f"trainer.{k}"] = float(v)
        snap = self.allocator.snapshot()
        rates = self.allocator.rates()
        busiest = sorted(self.stats.peers.items(), key=lambda kv: -kv[1].counters.bytes_sent)
        for peer, st in busiest[:MAX_REPORTED_LINKS]:  # the protocol bounds a report's keys
            if peer not in rates:
                continue  # links = "plan": a peer lost before it ever linked has no link state
            m[f"link.{peer}.bytes_sent"] = float(st.counters.bytes_sent)
            m[f"link.{peer}.rate_bps"] = float(rates[peer])
            last = snap.links[peer].last_time_s
            if last is not None:
                m[f"link.{peer}.time_s"] = float(last)
            busy = self.link_times.busy_s.get(peer)
            if busy is not None:  # the scheduler's link rate while sending (scheduler/control/link_rate.py)
                m[f"link.{peer}.busy_s"] = busy
                m[f"link.{peer}.busy_bytes"] = float(self.link_times.busy_bytes.get(peer, 0))
                peak = self.link_times.peak_bps.get(peer)
                if peak is not None:
                    m[f"link.{peer}.peak_bps"] = float(peak)
            backlog = self.link_times.backlog_s.get(peer)
            if backlog is not None:  # delivery while backlogged (scheduler/control/link_rate.py)
                m[f"link.{peer}.backlog_s"] = backlog
                m[f"link.{peer}.backlog_bytes"] = float(self.link_times.backlog_bytes.get(peer, 0))
            rx = self.rx_rates.get(peer)
            if rx is not None and (rx.samples or rx.fast):  # the peer → us direction at this receiver
                m[f"link.{peer}.rx_bytes"] = float(rx.rx_bytes)
                m[f"link.{peer}.rx_s"] = rx.rx_s
                m[f"link.{peer}.rx_n"] = float(rx.samples)
                m[f"link.{peer}.rx_fast"] = float(rx.fast)
        excess = len(m) - MAX_TELEMETRY_KEYS
        if excess > 0:  # a big plan and many links: per-rank times go first, the fastest ranks' first
            ranks = sorted((k for k in m if k.startswith("trainer.rank.")), key=lambda k: (m[k], k))
            for k in ranks[:excess]:
                del m[k]
        return Telemetry(self.site, max(frontier, 0), m)

    # ------------------------------------------------------------------------------------------------
    # views and control
    # ------------------------------------------------------------------------------------------------

    def apply_config(
        self, values: dict[str, Any], effective_iteration: int | None, now: float
    ) -> dict[str, Any]:
        """Forward a trainer configuration update; returns what was applied. Without an iteration it takes
        effect ahead of every site's frontier. Plan settings are refused: they must reach every gateway
        for the same iteration, which only the scheduler's two phases guarantee."""
        plan_keys = [k for k in values if k in PLAN_KEYS]
        if plan_keys:
            raise ConfigError(
                f"{plan_keys[0]}: plan settings are changed through the scheduler (the same for every site)",
                key=plan_keys[0],
            )
        if RESTART_KEY in values:
            raise ConfigError(
                f"{RESTART_KEY}: a restart is ordered by the scheduler's straggler policy only",
                key=RESTART_KEY,
            )
        if effective_iteration is None:
            frontier = -1 if self.engine is None else self.engine.frontier
            effective_iteration = frontier + self.cfg.rounds.window + 1
        msg = self._forward_config(values, effective_iteration, values)
        return {
            "values": msg.values,
            "effective_iteration": msg.effective_iteration,
            "forwarded": self._trainer is not None,
        }

    def _forward_config(self, values: dict[str, Any], effective: int, keep: dict[str, Any]) -> ConfigUpdate:
        """``values`` to the trainer connected now; ``keep`` (the same, or without a one-shot restart
        order) for trainer sessions that connect later and the reports to the scheduler."""
        msg = trainer_config_update(values, effective)
        if keep:
            self._config_update = msg if keep == values else trainer_config_update(keep, effective)
        if self._trainer is not None:
            self._out.append(ToTrainer(self._trainer, msg))
        return msg

    def _replacement_start(self) -> int:
        """Where the restart of a dead trainer starts: after its last push, and after every round whose
        result was delivered here meanwhile (rounds may finish without this site, x-order, before the
        empty pushes start; those results went to no trainer, so the new one must not wait for them)."""
        return max(self._next_trainer_push(), self._delivered_max + 1)

    def _next_trainer_push(self) -> int:
        """The first iteration the trainer has pushed no layer of (0 before any push)."""
        return 0 if self.ledger is None else self.ledger.next_push()

    def status(self) -> dict[str, Any]:
        engine = self.engine
        snap = self.allocator.snapshot()
        queue = self.queue.stats()
        live = set() if engine is None else set(engine.live)
        queues = queue.peers
        peers = {
            p: peer_view(st, snap.links[p], queues.get(p), live=p in live, t0=self.t0)
            for p, st in self.stats.peers.items()
            if p in snap.links  # links = "plan": only peers that linked have link state
        }
        return {
            "site": self.site,
            "job": self.job,
            "state": self.state,
            "frontier": -1 if engine is None else engine.frontier,
            "join_at": self.join_at,
            "open_rounds": 0 if engine is None else len(engine.open_rounds()),
            "live": sorted(live),
            "missing_rounds": dict(sorted(self.stats.missing_streak.items())),
            "peers": peers,
            "queue": {"items": queue.queued_items, "bytes": queue.queued_bytes},
            "rates": {
                "iteration": snap.iteration,
                "median_s": snap.median_s,
                "last_action": snap.last_action,
                "reallocations": snap.reallocations,
                "stragglers": snap.stragglers,
            },
            "recent_rounds": list(self.stats.recent),
            "engine": {} if engine is None else asdict(engine.stats),
            "trainer": {
                "connected": self._trainer is not None,
                "ledger": {} if self.ledger is None else asdict(self.ledger.stats),
                "retained_aggregates": 0 if self.ledger is None else len(self.ledger.unacked_aggregates()),
            },
            "model": {
                "site": None if self.model.current is None else self.model.current.site,
                "established": self.model.established,
                "conflicts": [list(c) for c in self.model.conflicts[-8:]],
            },
            "faults": self.faults.status(),
            "resync": {"need": self.resync.need, **asdict(self.resync.stats)},
            "trainer_run": self.runs.status(),
            "restart": {
                "order": None if self.restart.order is None else asdict(self.restart.order),
                "replaced": self.restart.replaced,
            },
            "counters": self.stats.counters(),
        }

    def metrics_text(self) -> str:
        return render_prometheus(self.status())

    def stats_file(self) -> dict[str, Any]:
        """What ``--stats-file`` holds (keys read by ``wanrt demo``; see gateways.stats)."""
        out = self.stats.counters()
        out["frontier"] = -1 if self.engine is None else self.engine.frontier
        out["rate_reallocations"] = self.allocator.reallocations
        out["engine"] = {} if self.engine is None else asdict(self.engine.stats)
        return out
