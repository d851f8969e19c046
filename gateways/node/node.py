"""One site's gateway as a sans-IO object: events in, with the time as an argument; actions out.

The h11 ``Connection`` idea at gateway scale. :class:`GatewayNode` takes every call of its driver and owns
the decisions that change the job: it creates the round engine when this site joins (or lets a peer
rejoin), applies the engine's actions (:meth:`GatewayNode.apply`: round messages to peers, results to
the trainer), declares peers lost, and says what a peer's round message does (acks it settles, a site
that fell behind). The rest is composed of parts split by whom they talk to, each owning its state:

* :class:`~gateways.rounds.engine.RoundEngine` — every WAN round (what to send to whom, when a round is
  finished, what is carried);
* the peer gateways — :class:`~gateways.node.peer_side.PeerSide` (a link coming up, a peer's frames, a
  link ending), :class:`~gateways.node.peer_admission.PeerAdmission` (who may link; from which iteration
  a gateway joins: :mod:`gateways.membership.joining`) and :class:`~gateways.node.peer_mesh.PeerMesh`
  (one :class:`~gateways.node.peer_channel.PeerChannel` per link: EDF by (iteration, layer), paced at
  the rate the :class:`~gateways.sending.rate_allocator.RateAllocator` sets from
  :mod:`gateways.sending.link_times`; heartbeats; what waits for a peer without a link, at most
  :data:`MAX_BACKLOG` messages);
* this site's trainer — :class:`~gateways.node.trainer_side.TrainerSide` (its session, its pushes, and
  what it is owed: results, empty answers and acks, with :mod:`gateways.membership.trainer_ledger` and
  :mod:`gateways.node.held_acks`) and :class:`~gateways.node.trainer_admission.TrainerAdmission` (which
  run may train here, what the Welcome says);
* the scheduler — :class:`~gateways.node.scheduler_side.SchedulerSide` (the two phases of its decisions,
  the trainers' configuration updates and their effective iteration, the reports' timing);
* :class:`~gateways.node.model_agreement.ModelAgreement` (which model is the job's; site faults) and
  :class:`~gateways.node.resync_routes.ResyncRoutes` (a parameter resync's messages, decided by
  :mod:`gateways.node.resync`);
* :class:`~gateways.node.reports.NodeReports` — telemetry, ``/status``, ``/metrics``, rendered from the
  node's state.

A part reads the node through a small ``Protocol`` of its module (``PeerHost``, ``TrainerHost``,
``RunHost``, ``SchedulerHost``, ``AdmissionHost``, ``ResyncHost``) and asks it for a decision only through
the methods listed there (:meth:`GatewayNode.peer_linked`, :meth:`GatewayNode.peer_round`,
:meth:`GatewayNode.declare_lost`, :meth:`GatewayNode.apply`, ...: for the parts, not for drivers); the
others get the parts they talk to; the reports read the node whole and change nothing. What the parts
send is appended to the node's one action list.

Whoever drives the node — :class:`~gateways.service.daemon.GatewayDaemon` over sockets and an event loop,
or the simulator in :mod:`sims` on virtual time — feeds it received bytes and trainer messages, asks it
what to write on each link (:meth:`GatewayNode.poll_link`), carries out :meth:`GatewayNode.pop_actions`,
and calls :meth:`GatewayNode.tick` at :meth:`GatewayNode.next_deadline`. Because both drivers run this
same object, a simulated gateway makes exactly the decisions a real one makes.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from gateways.config import GatewayConfig
from gateways.membership.job_model import JobModelState, ModelSignature
from gateways.membership.joining import LinkInfo, initial_live, join_iteration, lost_on_suspect
from gateways.membership.trainer_ledger import TrainerLedger
from gateways.node.actions import NodeAction, ToScheduler, ToTrainer
from gateways.node.model_agreement import ModelAgreement
from gateways.node.peer_admission import PeerAdmission
from gateways.node.peer_channel import PeerChannel, SendOut
from gateways.node.peer_mesh import MAX_BACKLOG, PeerMesh
from gateways.node.peer_side import PeerSide
from gateways.node.probe_link import ask_for_trains
from gateways.node.reports import NodeReports
from gateways.node.resync import ParamResync
from gateways.node.resync_routes import ResyncRoutes
from gateways.node.scheduler_side import SchedulerSide
from gateways.node.shard_relay import ShardRelay
from gateways.node.trainer_admission import TrainerAdmission
from gateways.node.trainer_restart import TrainerRestart
from gateways.node.trainer_runs import TrainerRuns
from gateways.node.trainer_side import TrainerSide
from gateways.rounds.actions import Action, Deliver, DeliverPiece, PeerSuspect, RoundClosed, Send
from gateways.rounds.engine import RoundEngine
from gateways.rounds.topology import PlanSpec, build_plan
from gateways.sending.edf_queue import make_send_queue
from gateways.sending.link_times import LinkTimes
from gateways.sending.rate_allocator import RateAllocator
from gateways.stats import GatewayStats
from wanrt.errors import (
    LocalProtocolError,
    MalformedPayload,
    ProtocolError,
    RemoteProtocolError,
    WanrtError,
)
from wanrt.payload import SparsePayload
from wanrt.protocol import (
    Ack,
    Bye,
    Connection,
    Hello,
    Message,
    ParamAnnounce,
    ParamChunk,
    ParamRefuse,
    ParamRequest,
    Push,
    PushPiece,
    ShardDone,
    ShardRequest,
    Telemetry,
)
from wanrt.protocol.peer.round_frames import RoundTag
from wanrt.protocol.peer.round_msg import RoundMsg

__all__ = ["MAX_BACKLOG", "GatewayNode"]

log = logging.getLogger("gateways.node")


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
        self.engine: RoundEngine | None = None
        self.ledger: TrainerLedger | None = None
        self.join_at: int | None = None
        # per-link state is sized by the links this gateway will have: every peer in a full mesh, only the
        # plan neighbours (added as their links come up) with ``links = "plan"`` (1 000-site simulations)
        mesh = cfg.links == "all"
        self.stats = GatewayStats(self.site, list(cfg.peers) if mesh else [])
        self.queue = make_send_queue(cfg.edf)
        self.allocator = RateAllocator(
            cfg.peers if mesh else (), cfg.base_rates_bps() if mesh else {}, cfg.rates
        )
        self.link_times = LinkTimes(settle=cfg.rounds.window + 1, delivery=cfg.delivery)
        #: changes whenever what link_info() says matters and could change (a link came up before the
        #: join, the join itself): a handshake whose info predates a change is refused and redone
        #: (gateways.service.peer_links); after the join handshakes are not serialised, as before
        self.link_epoch = 0
        #: the frontier this site had seen before a restart (the daemon's state_file): announced while
        #: fresh, so gateways restarted together resume the job past it instead of at iteration 0
        self.resume_frontier = -1
        #: the run this gateway serves and what it does while that run's trainer is dead
        self.runs = TrainerRuns(cfg.trainer_gone_grace_s)
        self.resync = ParamResync(self.site)  # parameter resync of a trainer that missed rounds
        self.restart = TrainerRestart()  # the scheduler's KILL_RESTART order for this site's trainer
        self._work: deque[Action] = deque()
        self._peer_final = False  # the actions being applied come from a peer's result
        self._applying = False
        self._out: list[NodeAction] = []  # shared with the parts below, which append what they send
        self._times_dirty = False
        self.t0 = now
        self.state = "created"
        # the parts, by whom they talk to
        self.model = JobModelState()
        self.mesh = PeerMesh(cfg, queue=self.queue, link_times=self.link_times, stats=self.stats)
        self.rx_rates = self.mesh.rx_rates
        self.probes = self.mesh.probes  # timed probe trains (gateways/node/probe_link.py)
        self.admission = PeerAdmission(cfg, self, self.model, self.mesh.contacted)
        self.trainer = TrainerSide(
            cfg,
            self,
            self._out,
            stats=self.stats,
            model=self.model,
            mesh=self.mesh,
            runs=self.runs,
        )
        self.trainer_admission = TrainerAdmission(
            cfg,
            self,
            self.trainer,
            stats=self.stats,
            model=self.model,
            runs=self.runs,
            restart=self.restart,
            resync=self.resync,
        )
        self.agreement = ModelAgreement(self.site, self.mesh, self.trainer, self.model, self.stats, self._out)
        self.faults = self.agreement.faults
        self.resync_routes = ResyncRoutes(cfg, self, self.resync, self.mesh, self.trainer)
        self._shards = ShardRelay(self.site)  # the trainer's data-shard traffic (scheduler.sharding)
        self.scheduler = SchedulerSide(
            cfg, self, self._out, trainer=self.trainer, restart=self.restart, shards=self._shards
        )
        self.peer_side = PeerSide(
            cfg,
            self,
            self._out,
            mesh=self.mesh,
            admission=self.admission,
            agreement=self.agreement,
            resync=self.resync_routes,
            model=self.model,
            stats=self.stats,
            allocator=self.allocator,
        )
        self.reports = NodeReports(self)

    # ------------------------------------------------------------------------------------------------
    # driving the node
    # ------------------------------------------------------------------------------------------------

    def start(self, now: float) -> None:
        """Listeners are up: a gateway without peers runs the job alone from iteration 0."""
        if not self.cfg.peers:
            self._create_engine(0, set(self.sites), now)
        self.admission.started(now)
        self.state = "joining" if self.engine is None else "running"

    @property
    def joined(self) -> bool:
        return self.engine is not None

    def pop_actions(self) -> list[NodeAction]:
        """What the driver must do now; also a :class:`Wake` for every link with bytes to write."""
        out: list[NodeAction] = [*self._out, *self.mesh.wakes()]
        self._out.clear()
        return out

    def next_deadline(self) -> float | None:
        """The earliest time :meth:`tick` has something to do (rounds, heartbeats, a member not linked)."""
        best = self.mesh.next_due()
        for d in (self.trainer.give_up_at, self.scheduler.next_report, self.resync.retry_at, self.runs.due()):
            if d is not None and (best is None or d < best):
                best = d
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
                self.apply(self.engine.tick(now), now)

        def silent(ch: PeerChannel, exc: WanrtError) -> None:
            self.peer_side.end_link(ch, f"peer silent: {exc.message}", now, error=exc)

        self.mesh.beat(now, silent)
        self.trainer.give_up(now)
        for peer in self.mesh.unlinked_past(now):
            if peer not in self.mesh.by_peer and self.state == "running":
                self.declare_lost(peer, f"no link within {self.mesh.lost_after:g} s of joining", now)
        if self.scheduler.report_due(now):
            self._out.append(ToScheduler(self.telemetry(now)))
            ask_for_trains(self.probes, self.mesh.by_peer, now)
        if self.resync.retry_at is not None and now >= self.resync.retry_at:
            self.resync_routes.retry(now)
        self.trainer.fill_for_dead_trainer(now)
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
        for ch in self.mesh.channels.values():
            if not ch.ended:
                ch.send_control(Bye(reason[:200]))
        self.trainer.send(Bye(reason[:200]))

    def stopped(self) -> None:
        self.state = "stopped"

    # ------------------------------------------------------------------------------------------------
    # the round engine
    # ------------------------------------------------------------------------------------------------

    def _create_engine(self, start: int, live: set[str], now: float) -> None:
        rc = self.cfg.rounds
        spec = self.scheduler.plan_spec or PlanSpec.make(rc.topology, arity=rc.tree_arity, root=self.cfg.root)
        plan = spec if live >= set(self.sites) else build_plan(spec, live)
        self.engine = RoundEngine(self.site, self.sites, plan, rc, start_iteration=start)
        self.ledger = TrainerLedger(self.site, start)
        self.join_at = start
        self.link_epoch += 1
        self.state = "running"
        log.info("joined job %s at iteration %d with members %s", self.job, start, ", ".join(sorted(live)))
        # a member that never links is as silent as one whose heartbeats stopped: every gateway gives it
        # the same time, so they all count it out (and in again when it comes) alike
        expected = live - {self.site} - set(self.mesh.by_peer)
        if self.cfg.links == "plan":  # only plan neighbours link (GatewayConfig.links; sims/ 1000-site trees)
            expected &= set(self.engine.plan_for(start).neighbours(self.site))
        for peer in sorted(expected):
            self.mesh.expect(peer, now + self.mesh.lost_after)

    def apply(self, actions: list[Action], now: float) -> None:
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
                    self.trainer.deliver(action, from_peer=self._peer_final)
                elif isinstance(action, DeliverPiece):
                    self.trainer.deliver_piece(action)
                elif isinstance(action, RoundClosed):
                    self._round_closed(action, now)
                elif isinstance(action, PeerSuspect):
                    self._suspect(action, now)
        finally:
            self._applying = False
        self.trainer.release_unsent()
        self._observe_link_times(now)
        self.trainer.fill_for_dead_trainer(now)

    def _round_closed(self, action: RoundClosed, now: float) -> None:
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
            self.agreement.warn_trainer(  # the trainer hears it too, not only this gateway's log
                site,
                "trainer",
                f"rounds complete without site {site} ({n} in a row): is its trainer running? "
                "The job trains on without its data",
                now,
            )
        if not action.delivered:
            self.trainer.answer_empty(action.iteration, action.layer)

    def _send_round(self, peer: str, msg: RoundMsg, now: float) -> None:
        ch = self.mesh.writable(peer)
        if ch is not None:
            try:
                ch.send_round(msg)
                if msg.kind == "final":
                    self.trainer.result_sent(peer, ch.sent_seq, (msg.iteration, msg.layer))
            except ProtocolError as exc:
                log.error("cannot frame a round message for %s: %s; closing that link", peer, exc)
                self.peer_side.end_link(ch, f"cannot frame a round message: {exc}", now, abort=True)
            return
        assert self.engine is not None
        if peer not in self.engine.live:
            return  # lost: the engine re-planned the round without it
        if self.mesh.hold(peer, msg) > MAX_BACKLOG:
            self.declare_lost(peer, f"no link for {MAX_BACKLOG} queued round messages", now)

    def _suspect(self, s: PeerSuspect, now: float) -> None:
        self.stats.suspects += 1
        ch = self.mesh.by_peer.get(s.peer)
        if lost_on_suspect(ch is not None and not ch.ended):
            self.declare_lost(s.peer, f"silent for {s.waited:.1f} s and no link ({s.reason})", now)
        else:
            log.info(
                "peer %s slow: round (%d, %d) waited %.1f s for it (%s); its link is up",
                s.peer,
                s.iteration,
                s.layer,
                s.waited,
                s.reason,
            )

    def declare_lost(self, peer: str, reason: str, now: float) -> None:
        """``peer`` is lost: the round engine re-plans every open round without it."""
        if self.engine is None or peer not in self.engine.live:
            return
        dropped = self.mesh.backlog.pop(peer, [])
        self.stats.peer_state(peer, "lost", now, reason)
        log.warning(
            "peer %s lost: %s; the round engine re-plans without it (%d unsent messages re-planned)",
            peer,
            reason,
            len(dropped),
        )
        self.apply(self.engine.peer_lost(peer, now), now)

    def set_plan(self, spec: PlanSpec, now: float, effective_iteration: int | None = None) -> None:
        """Adopt a topology from ``effective_iteration`` on (every unfinished round if None), e.g. a
        straggler re-attached under parent-child. Every gateway must be told the same spec and iteration."""
        if self.engine is None:
            raise LocalProtocolError("set_plan before this gateway joined the job")
        self.apply(self.engine.set_plan(spec, now, effective_iteration), now)

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
                ch = self.mesh.by_peer.get(peer)
                if ch is not None:
                    ch.pacer.set_rate(rate, now)

    # ------------------------------------------------------------------------------------------------
    # peer links (gateways.node.peer_side; what they change for the job, here)
    # ------------------------------------------------------------------------------------------------

    def dialer_problem(self, hello: Hello) -> str | None:
        """Why a connecting gateway is refused (``None``: accept)."""
        return self.admission.dialer_problem(hello)

    def link_info(self, peer: str) -> dict[str, Any]:
        """Our handshake ``info`` for ``peer`` (the join rule uses what was sent: keep it)."""
        return self.admission.link_info(peer)

    def link_up(
        self, peer: str, conn: Connection, ours: dict[str, Any], theirs: dict[str, Any], now: float
    ) -> int:
        """An authenticated link to ``peer``: returns its id. Raises RemoteProtocolError to refuse it."""
        return self.peer_side.link_up(peer, conn, ours, theirs, now)

    def link_data(self, link_id: int, data: bytes, now: float) -> None:
        """Bytes received on link ``link_id``."""
        self.peer_side.link_data(link_id, data, now)

    def link_closed(self, link_id: int, reason: str, now: float) -> None:
        """The driver saw link ``link_id`` end (the peer went away, the transport failed)."""
        self.peer_side.link_closed(link_id, reason, now)

    def poll_link(self, link_id: int, now: float) -> SendOut:
        """What link ``link_id``'s writer does next (see :class:`~gateways.node.peer_channel.SendOut`)."""
        return self.mesh.poll(link_id, now)

    def channel(self, link_id: int) -> PeerChannel | None:
        return self.mesh.channel(link_id)

    def link_id_of(self, peer: str) -> int | None:
        return self.mesh.link_id_of(peer)

    def rejected(
        self, who: str, why: str, site: str | None = None, now: float | None = None, *, kind: str = "config"
    ) -> None:
        """A connection was refused (:meth:`PeerSide.rejected`)."""
        self.peer_side.rejected(who, why, site, now, kind=kind, t0=self.t0)

    def peer_linked(self, peer: str, mine: LinkInfo, other: LinkInfo, now: float) -> None:
        """A link to ``peer`` came up: this site joins the job through it (from the iteration
        :meth:`PeerAdmission.join_start` says), or ``peer`` rejoins the job (gateways.membership.joining)."""
        if self.engine is None:
            self.link_epoch += 1  # after the join, handshakes are not serialised (see link_epoch)
            start = self.admission.join_start(mine, other)
            self._create_engine(start, initial_live(self.site, peer, other, self.sites), now)
            for site, at in other.joins:  # joins the peer agreed before this engine existed
                if self.engine is not None and at > start and site in self.engine.live and site != self.site:
                    self.engine.known_join(site, at)
            if not other.fresh and start > self.resume_frontier + 1:  # missed rounds: fetch the parameters
                self.start_resync(start)
            if other.fresh and self.resume_frontier >= 0 and self.ledger is not None:
                # resumed from a state file with a peer that restarted too: no survivor will say which of
                # the trainer's re-sent pushes were counted, so they are carried (at least once)
                self.ledger.nobody_knows = True
        elif peer not in self.engine.live:
            at = join_iteration(mine, other, margin=self.cfg.rounds.window)
            log.info("gateway %s rejoins the job at iteration %d", peer, at)
            self.apply(self.engine.peer_joined(peer, now, at), now)
            if other.fresh:  # restarted: it will never settle the rounds it missed (RoundEngine docs)
                self.apply(self.engine.fresh_peer_joined(peer, at, now), now)

    def peer_round(self, ch: PeerChannel, tag: RoundTag, msg: RoundMsg, now: float) -> None:
        """A round message from ``ch``'s peer, for the round engine."""
        engine, ledger = self.engine, self.ledger
        assert engine is not None and ledger is not None  # a link is up only once the engine exists
        if self._on_message is not None:
            self._on_message(ch.peer, msg)
        if msg.payload is not None and not msg.payload.is_finite():
            msg = dataclasses.replace(msg, payload=self.non_finite(msg.payload, ch.peer))
        settled = engine.stats.settled
        if msg.kind == "outcome":
            self.trainer.send_acks(ledger.on_outcome(msg.layer, msg.step, msg.iteration, msg.sites))
            self.trainer.arm_give_up(now)
        self._peer_final = msg.kind in ("final", "segment_final")  # a result that exists elsewhere too
        try:
            self.apply(engine.peer_message(ch.peer, msg, now), now)
        finally:
            self._peer_final = False
        ch.taken(tag)
        if engine.stats.settled > settled:
            self.agreement.warn_trainer(
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
            self.start_resync(engine.frontier + 1)

    def peer_acked(self, peer: str, seq: int | None, now: float) -> None:
        """``peer`` acknowledged our frames up to ``seq`` (None: its link ended): the results made here
        that it now has (or that only waited for it) release their trainer push acks; the link's times
        may be final."""
        self.trainer.release(peer, seq)
        if seq is not None and self.link_times.acked_through(peer, seq, now):
            self._times_dirty = True
            self._observe_link_times(now)

    # ------------------------------------------------------------------------------------------------
    # the trainer (gateways.node.trainer_side; the model check crosses to gateways.node.model_agreement)
    # ------------------------------------------------------------------------------------------------

    def trainer_auth_failed(self, reason: str, now: float) -> None:
        """A connection to this site's trainer socket failed to authenticate (the peers hear of it)."""
        self.agreement.trainer_auth_failed(reason, now)

    def trainer_welcome_info(self, hello: dict[str, Any] | None = None) -> dict[str, Any]:
        """The Welcome's info for a trainer whose Hello said ``hello`` (see :class:`TrainerAdmission`)."""
        return self.trainer_admission.welcome_info(hello)

    def trainer_model_problem(self, info: dict[str, Any]) -> str | None:
        """Why this trainer may not train here (None: fine): another run is being served, or its model is
        not the job's (its signature may be adopted)."""
        problem = self.trainer_admission.run_problem(info)
        if problem is not None:
            return problem
        try:
            sig = ModelSignature.from_info(info, site=self.site, peer="trainer")
        except RemoteProtocolError as exc:
            return exc.message
        if sig is None:
            return None
        return self.agreement.trainer_offer(sig)

    def trainer_connected(self, session: int) -> None:
        """Trainer session ``session`` passed its handshake; it replaces any earlier one."""
        self.trainer.connect(session)
        # a pending resync first: the trainer must hold every result it gets from now on (one applied
        # before the notice, of an iteration the snapshot lacks, would be overwritten by the snapshot)
        self.resync_routes.send(self.resync.trainer_connected())
        if self.ledger is not None:
            for msg in self.ledger.unacked_aggregates():
                self.trainer.send(msg)
        if self.scheduler.config_update is not None:
            self.trainer.send(self.scheduler.config_update)
        for notice in self.faults.replay():
            self.trainer.send(notice)

    def trainer_disconnected(
        self, session: int, reason: str, *, clean: bool = False, now: float | None = None
    ) -> None:
        """The trainer session ended: ``clean`` when its ``close()`` said Bye (the run finished here), else
        it died (gateways.node.trainer_runs: after a grace the gateway pushes empty contributions for it,
        and the next run is its restart)."""
        if self.trainer.disconnect(session, reason, clean=clean, now=now or 0.0):
            self.scheduler.send(self._shards.trainer_left(reason, self.scheduler.up))  # DOING → TODO
            self.resync_routes.send(self.resync.trainer_left())
        log.info("trainer disconnected: %s", reason)

    def check_trainer_push(self, push: Push | PushPiece) -> None:
        """A push must name this job and this site (RemoteProtocolError: the trainer's connection ends)."""
        self.trainer.check_push(push)

    def trainer_push(self, session: int, push: Push, now: float) -> None:
        """A push from the trainer (:meth:`TrainerSide.push`)."""
        self.trainer.push(session, push, now)

    def trainer_push_piece(self, session: int, piece: PushPiece, now: float) -> None:
        """A piece of a streamed push (:meth:`TrainerSide.push_piece`)."""
        self.trainer.push_piece(session, piece, now)

    def trainer_telemetry(self, msg: Telemetry, now: float) -> None:
        """The site leader's measurements of one iteration, for the next report to the scheduler."""
        self.trainer.telemetry(msg)

    def trainer_shards(self, session: int, msg: ShardRequest | ShardDone, now: float) -> None:
        """A shard request or DONE report of the current trainer, relayed to the scheduler under this
        site's name (:mod:`gateways.node.shard_relay`); a replaced session's are ignored."""
        if session != self.trainer.session:
            return
        up, down = self._shards.from_trainer(msg, self.scheduler.up)
        self.scheduler.send(up)
        self._out.extend(ToTrainer(session, m) for m in down)

    def trainer_params(
        self, session: int, msg: ParamRequest | ParamAnnounce | ParamChunk | ParamRefuse, now: float
    ) -> None:
        """A resync message of the current trainer: its own question, or its answer to a peer's."""
        sig = self.model.current
        self.resync_routes.from_trainer(session, msg, None if sig is None else sig.n_layers, now)

    def start_resync(self, iteration: int) -> None:
        """This site's trainer missed rounds: fetch the job's parameters of ``iteration`` from a peer."""
        self.resync_routes.start(iteration)

    def trainer_ack(self, ack: Ack) -> None:
        if self.ledger is not None:
            self.ledger.aggregate_acked(ack.iteration, ack.layer)

    def non_finite(self, p: SparsePayload, who: str) -> SparsePayload:
        """A payload with NaN/Inf values (``non_finite`` setting): refused, or counted as empty."""
        if self.cfg.non_finite == "reject_link":
            raise MalformedPayload(f"layer {p.layer}: NaN or Inf values", peer=who, value=p.layer)
        self.stats.non_finite_dropped += 1
        log.error("layer %d from %s holds NaN or Inf values: counted as an empty contribution", p.layer, who)
        return SparsePayload.empty(p.layer, p.dense_len, p.block_size, p.value_dtype)

    # ------------------------------------------------------------------------------------------------
    # the scheduler (two-phase commit in gateways.node.scheduler_side) and what the node reports
    # ------------------------------------------------------------------------------------------------

    def scheduler_connected(self, now: float) -> None:
        """The link to the job's scheduler is up: report at once (it resumes from what gateways say)."""
        self.scheduler.connected(now)
        self._out.append(ToScheduler(self.telemetry(now)))
        self.scheduler.send(self._shards.scheduler_up())

    def scheduler_disconnected(self, now: float) -> None:
        """Training goes on with the last committed decision; prepared ones are forgotten."""
        self.scheduler.disconnected()

    def scheduler_message(self, msg: Message, now: float) -> None:
        """An Announce or a shard grant from the scheduler (:meth:`SchedulerSide.scheduler_message`)."""
        self.scheduler.scheduler_message(msg, now)

    def apply_config(
        self, values: dict[str, Any], effective_iteration: int | None, now: float
    ) -> dict[str, Any]:
        """Forward a trainer configuration update (:meth:`SchedulerSide.apply_config`)."""
        return self.scheduler.apply_config(values, effective_iteration, now)

    def telemetry(self, now: float) -> Telemetry:
        return self.reports.telemetry(now)

    def status(self) -> dict[str, Any]:
        return self.reports.status()

    def metrics_text(self) -> str:
        return self.reports.metrics_text()

    def stats_file(self) -> dict[str, Any]:
        return self.reports.stats_file()
