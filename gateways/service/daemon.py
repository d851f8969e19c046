"""The per-site gateway daemon: sockets, the event loop, timers, signals and HTTP around one
:class:`~gateways.node.GatewayNode`, which makes every decision.

What this file does, and nothing more: accept and dial connections (:mod:`gateways.service.peer_links`,
:mod:`gateways.service.trainer_session`, :mod:`gateways.service.http_api`), hand what arrives to the node
with the loop's time, carry out the node's actions (wake a link's writer, close a link the way the node
says, send to the trainer), and call :meth:`GatewayNode.tick` at :meth:`GatewayNode.next_deadline`.

Shutdown is phased (:meth:`GatewayDaemon.stop`): stop accepting connections and reconnecting; let in-flight
rounds finish and queues drain for up to ``shutdown_deadline_s``; say Bye on every link and cancel what is
left; close. Cancelling the task running :meth:`GatewayDaemon.run` instead drops every connection at once
(an abrupt stop, as if the process died).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

from gateways.config import GatewayConfig
from gateways.node import CloseLink, GatewayNode, RefuseTrainer, ToScheduler, ToTrainer, Wake
from gateways.rounds.actions import Action
from gateways.rounds.topology import PlanSpec
from gateways.service.codec_warmup import warm_up_codec
from gateways.service.http_api import MetricsServer
from gateways.service.peer_link import PeerLink, abort_transport
from gateways.service.peer_links import PeerLinks
from gateways.service.scheduler_link import SchedulerLink
from gateways.service.state_file import load_frontier, save_frontier
from gateways.service.trainer_session import TrainerSession, serve_trainer
from transports import BandwidthTrace, Listener, Timeouts, Transport, listen, parse_url
from transports.congestion import set_congestion
from wanrt.protocol import (
    Ack,
    Connection,
    Hello,
    Message,
    Notice,
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
from wanrt.protocol.peer.round_msg import RoundMsg

__all__ = ["GatewayDaemon"]

log = logging.getLogger(__name__)


class GatewayDaemon:
    """One site's gateway; ``on_action`` / ``on_message`` observe the node (see :class:`GatewayNode`)."""

    def __init__(
        self,
        cfg: GatewayConfig,
        *,
        on_action: Callable[[Action], None] | None = None,
        on_message: Callable[[str, RoundMsg], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.site = cfg.site
        self.job = cfg.job
        self._creds = cfg.credentials()
        self._on_action = on_action
        self._on_message = on_message
        self._traces = {
            p: BandwidthTrace.load(s.trace) for p, s in cfg.shaping.items() if s.trace is not None
        }
        self.node = GatewayNode(
            cfg, 0.0, on_action=on_action, on_message=on_message
        )  # re-made at start() with the loop's time
        self._links: dict[int, PeerLink] = {}
        self._saved_frontier = -1  # what state_file holds (gateways.service.state_file)
        self._peer_links = PeerLinks(cfg, self, self._creds)
        self._trainer_listener: Listener | None = None
        self._sessions: dict[int, TrainerSession] = {}
        self._session_ids = itertools.count(1)
        self._http: MetricsServer | None = None
        self._scheduler: SchedulerLink | None = None
        self._timer_task: asyncio.Task[None] | None = None
        self._timer_due: float | None = None  # the node deadline the timer task sleeps until
        self._gate = asyncio.Lock()
        self._joined = asyncio.Event()
        self._timer_wake = asyncio.Event()
        self._progress = asyncio.Event()
        self._stop_requested = asyncio.Event()
        self._drain_task: asyncio.Task[bool] | None = None

    # -- views that tests and tools read -------------------------------------------------------------

    @property
    def sites(self) -> tuple[str, ...]:
        return self.node.sites

    @property
    def engine(self) -> Any:
        return self.node.engine

    @property
    def ledger(self) -> Any:
        return self.node.ledger

    @property
    def model(self) -> Any:
        return self.node.model

    @property
    def stats(self) -> Any:
        return self.node.stats

    @property
    def allocator(self) -> Any:
        return self.node.allocator

    @property
    def link_times(self) -> Any:
        return self.node.link_times

    @property
    def state(self) -> str:
        return self.node.state

    @property
    def join_at(self) -> int | None:
        return self.node.join_at

    @property
    def timeouts(self) -> Timeouts:
        return self.cfg.timeouts

    def links(self) -> dict[str, PeerLink]:
        """The live link per peer."""
        return {
            link.peer: link
            for link in self._links.values()
            if self.node.link_id_of(link.peer) == link.link_id
        }

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    # ------------------------------------------------------------------------------------------------
    # lifecycle
    # ------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Bring every listener up (then :meth:`ready_info` is valid) and start dialing peers."""
        self.node = GatewayNode(self.cfg, self._now(), on_action=self._on_action, on_message=self._on_message)
        if self.cfg.state_file is not None:
            self.node.resume_frontier = self._saved_frontier = load_frontier(
                self.cfg.state_file, job=self.job, site=self.site
            )
        if self.cfg.resume_at is not None:
            # the frontier that makes the fresh gateways' join rule (max frontier + 1 + window) start the
            # job exactly at the checkpoint's iteration (gateways.membership.joining.join_iteration)
            at = self.cfg.resume_at
            self.node.resume_frontier = at - 1 - self.cfg.rounds.window if at else -1
            log.info("resuming the job at iteration %d (the trainers' checkpoint)", at)
        await asyncio.to_thread(warm_up_codec)  # never inside the first round (see codec_warmup)
        try:
            trainer_url = parse_url(self.cfg.trainer_listen).url
            self._trainer_listener = await listen(
                trainer_url, lambda t: serve_trainer(self, t), timeouts=self.cfg.timeouts
            )
            await self._peer_links.start()
            if self.cfg.metrics_port:
                self._http = MetricsServer(self, self.cfg.metrics_host, self.cfg.metrics_port)
                await self._http.start()
            if self.cfg.scheduler is not None:
                self._scheduler = SchedulerLink(
                    self.cfg,
                    self._creds.for_scheduler(),
                    on_up=self._scheduler_up,
                    on_down=self._scheduler_down,
                    on_message=self._scheduler_message,
                )
                self._scheduler.start()
        except BaseException:
            await self._close_endpoints()
            raise
        self._timer_task = asyncio.get_running_loop().create_task(self._timer(), name="node timer")
        self.node.start(self._now())
        self._after()
        log.info(
            "gateway %s of job %s up: peers on %s, trainer on %s%s",
            self.site,
            self.job,
            self._peer_links.url,
            self._trainer_listener.url,
            f", metrics on {self._http.url}" if self._http else "",
        )

    def ready_info(self) -> dict[str, Any]:
        """What ``--ready-file`` holds: the actual bound addresses."""
        return {
            "pid": os.getpid(),
            "site": self.site,
            "listen": self._peer_links.url,
            "trainer_listen": None if self._trainer_listener is None else self._trainer_listener.url,
            "metrics_url": None if self._http is None else self._http.url,
            "t0_monotonic": self.node.t0,  # the loop clock at the node start (bandwidth traces start here)
        }

    def request_stop(self) -> None:
        """Ask for a phased shutdown (SIGTERM/SIGINT); asked again, skip waiting for in-flight rounds."""
        if self._stop_requested.is_set():
            if self._drain_task is not None:
                log.warning("second stop request: not waiting for in-flight rounds")
                self._drain_task.cancel()
            return
        self._stop_requested.set()

    async def wait_stop_requested(self) -> None:
        await self._stop_requested.wait()

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        """Until ``predicate()`` holds, re-checked whenever this gateway's state changed (tests, tools)."""
        while not predicate():
            self._progress.clear()
            await self._progress.wait()

    async def wait_joined(self) -> None:
        """Until this gateway has joined the job (its round engine exists)."""
        await self._joined.wait()

    async def run(self, *, on_ready: Callable[[], None] | None = None) -> dict[str, Any]:
        """Start, call ``on_ready`` (listeners are up), serve until :meth:`request_stop`, stop in phases;
        returns the final stats. Cancelled instead, every connection is dropped at once, as if the process
        had died."""
        await self.start()
        try:
            if on_ready is not None:
                on_ready()
            await self._stop_requested.wait()
            return await self.stop()
        except asyncio.CancelledError:
            await self.abort()
            raise

    async def stop(self) -> dict[str, Any]:
        """Phased shutdown (module docstring); returns the stats-file contents."""
        if self.node.state in ("stopping", "stopped"):
            return self.stats_file()
        self.node.begin_stop()
        self._stop_requested.set()
        log.info("shutting down: phase 1, no new connections")
        self._peer_links.stop_accepting()
        if self._trainer_listener is not None:
            self._trainer_listener.close()
        log.info("phase 2: finishing in-flight rounds (up to %g s)", self.cfg.shutdown_deadline_s)
        self._drain_task = asyncio.get_running_loop().create_task(self._drain(), name="drain")
        await asyncio.wait([self._drain_task])
        finished = not self._drain_task.cancelled() and self._drain_task.result()
        if not finished:
            engine = self.node.engine
            log.warning(
                "phase 2 ended with %d open rounds and %d queued messages",
                0 if engine is None else len(engine.open_rounds()),
                len(self.node.queue),
            )
        log.info("phase 3: saying goodbye, cancelling what is left")
        self.node.say_goodbye("gateway shutting down")
        self._after()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.cfg.timeouts.close):
                for link in list(self._links.values()):
                    await link.done.wait()
        for session in list(self._sessions.values()):
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.cfg.timeouts.close):
                    await session.wait_drained()
        log.info("phase 4: closing")
        await self._close_endpoints()
        self.node.stopped()
        return self.stats_file()

    async def abort(self) -> None:
        """Drop everything at once: connections aborted (no Bye), tasks cancelled, listeners closed."""
        self.node.stopped()
        for link in list(self._links.values()):
            abort_transport(link.transport)
        for session in list(self._sessions.values()):
            abort_transport(session.transport)
        await self._close_endpoints()

    async def _close_endpoints(self) -> None:
        if self._scheduler is not None:
            await self._scheduler.aclose()
        if self._timer_task is not None:
            self._timer_task.cancel()
            await asyncio.gather(self._timer_task, return_exceptions=True)
        await self._peer_links.aclose()
        if self._trainer_listener is not None:
            await self._trainer_listener.wait_closed()
        if self._http is not None:
            await self._http.aclose()

    async def _drain(self) -> bool:
        """Wait until no round is open and nothing is queued for peers or the trainer (or the deadline)."""
        try:
            async with asyncio.timeout(self.cfg.shutdown_deadline_s):
                while True:
                    self._progress.clear()
                    pending = [s for s in self._sessions.values() if not s.drained]
                    if pending:
                        await pending[0].wait_drained()
                        continue
                    if self.node.idle():
                        return True
                    await self._progress.wait()
        except TimeoutError:
            return False

    def progressed(self) -> None:
        self._progress.set()

    # ------------------------------------------------------------------------------------------------
    # carrying out the node's actions
    # ------------------------------------------------------------------------------------------------

    def _after(self) -> None:
        """After every call into the node: do what it asks, re-arm the timer, tell waiters."""
        for action in self.node.pop_actions():
            if isinstance(action, Wake):
                link = self._links.get(action.link_id)
                if link is not None:
                    link.wake()
            elif isinstance(action, CloseLink):
                link = self._links.get(action.link_id)
                if link is not None:
                    link.close_as(action)
            elif isinstance(action, ToTrainer):
                session = self._sessions.get(action.session)
                if session is not None:
                    session.send(action.msg)
            elif isinstance(action, RefuseTrainer):
                session = self._sessions.get(action.session)
                if session is not None:
                    session.refuse(action.reason)
            elif isinstance(action, ToScheduler) and self._scheduler is not None:
                self._scheduler.send(action.msg)
        if self.node.joined and not self._joined.is_set():
            self._joined.set()
        self._persist()
        due = self.node.next_deadline()
        if due is not None and (self._timer_due is None or due < self._timer_due):
            self._timer_wake.set()  # an earlier deadline than the timer sleeps until
        self._progress.set()

    def _persist(self) -> None:
        """Keep the frontier in ``state_file`` whenever it advanced (see gateways.service.state_file)."""
        engine = self.node.engine
        if self.cfg.state_file is None or engine is None or engine.frontier <= self._saved_frontier:
            return
        self._saved_frontier = engine.frontier
        save_frontier(self.cfg.state_file, job=self.job, site=self.site, frontier=engine.frontier)

    async def _timer(self) -> None:
        """Call ``node.tick`` at ``node.next_deadline()``; woken early for an earlier deadline."""
        loop = asyncio.get_running_loop()
        while True:
            self._timer_wake.clear()
            due = self._timer_due = self.node.next_deadline()
            if due is None:
                await self._timer_wake.wait()
                continue
            delay = due - loop.time()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._timer_wake.wait()
                continue
            self._timer_due = None
            self.node.tick(loop.time())
            self._after()

    def set_plan(self, spec: PlanSpec, effective_iteration: int | None = None) -> None:
        """Adopt a topology from ``effective_iteration`` on (see :meth:`GatewayNode.set_plan`)."""
        self.node.set_plan(spec, self._now(), effective_iteration)
        self._after()

    # -- the scheduler link ---------------------------------------------------------------------------

    def _scheduler_up(self) -> None:
        self.node.scheduler_connected(self._now())
        self._after()

    def _scheduler_down(self, reason: str) -> None:
        self.node.scheduler_disconnected(self._now())
        self._after()

    def _scheduler_message(self, msg: Message) -> None:
        self.node.scheduler_message(msg, self._now())  # a RemoteProtocolError ends the scheduler link
        self._after()

    # ------------------------------------------------------------------------------------------------
    # peer links (LinksOwner)
    # ------------------------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def handshake_gate(self) -> AsyncIterator[None]:
        """Serialise handshakes until this gateway has joined (its first link fixes its start)."""
        if self.node.joined:
            yield
            return
        async with self._gate:
            yield

    def dialer_problem(self, hello: Hello) -> str | None:
        return self.node.dialer_problem(hello)

    def link_info(self, peer: str) -> dict[str, Any]:
        return self.node.link_info(peer)

    def link_epoch(self) -> int:
        return self.node.link_epoch

    def link_up(
        self, peer: str, conn: Connection, transport: Transport, ours: dict[str, Any], theirs: dict[str, Any]
    ) -> PeerLink:
        link_id = self.node.link_up(peer, conn, ours, theirs, self._now())  # may refuse (raises)
        problem = set_congestion(transport, self.cfg.tcp_congestion)
        if problem is not None:
            log.warning("link to gateway %s: %s", peer, problem)
        link = PeerLink(
            self,
            link_id,
            peer,
            conn,
            transport,
            timeouts=self.cfg.timeouts,
            trace=self._traces.get(peer),
            trace_start=self.node.t0,
        )
        self._links[link_id] = link
        log.info("link to gateway %s up (%s)", peer, transport.peer)
        self._after()
        return link

    def link_data(self, link_id: int, data: bytes) -> None:
        self.node.link_data(link_id, data, self._now())
        self._after()

    def link_finished(self, link: PeerLink, reason: str) -> None:
        """``link``'s tasks ended (its transport is about to be closed)."""
        self.node.link_closed(link.link_id, reason, self._now())
        self._after()

    def link_down(self, link: PeerLink) -> None:
        self._links.pop(link.link_id, None)  # the node let go of it in link_finished
        self._progress.set()  # its buffers are released now (tests wait for this)

    def rejected(self, who: str, why: str, site: str | None = None, *, kind: str = "config") -> None:
        self.node.rejected(who, why, site, self._now(), kind=kind)
        self._progress.set()

    # ------------------------------------------------------------------------------------------------
    # the trainer (TrainerOwner)
    # ------------------------------------------------------------------------------------------------

    def secret(self) -> bytes:
        """What this site's trainer proves with (its own key with per-site keys, not a gateway's)."""
        return self._creds.for_trainer()

    def trainer_welcome_info(self, hello: dict[str, Any]) -> dict[str, Any]:
        return self.node.trainer_welcome_info(hello)

    def trainer_auth_failed(self, reason: str) -> None:
        self.node.trainer_auth_failed(reason, self._now())
        self._after()

    def trainer_refusal_notice(self) -> Notice | None:
        agreement = self.node.agreement
        notice, agreement.refusal_notice = agreement.refusal_notice, None
        return notice

    def trainer_model_problem(self, info: dict[str, Any]) -> str | None:
        problem = self.node.trainer_model_problem(info)
        self._after()
        return problem

    def trainer_connected(self, session: TrainerSession) -> None:
        sid = next(self._session_ids)
        session.session_id = sid
        self._sessions[sid] = session
        log.info("trainer connected (%s)", session.peer)
        self.node.trainer_connected(sid)
        self._after()

    def trainer_disconnected(self, session: TrainerSession, reason: str, *, clean: bool) -> None:
        self._sessions.pop(session.session_id, None)
        self.node.trainer_disconnected(session.session_id, reason, clean=clean, now=self._now())
        self._after()
        log.info("trainer %s disconnected: %s", session.peer, reason)

    async def trainer_push(self, session: TrainerSession, push: Push) -> None:
        self.node.check_trainer_push(push)  # refused at once, not after the join
        await self._joined.wait()  # flow control: the node runs rounds once it has joined the job
        self.node.trainer_push(session.session_id, push, self._now())
        self._after()

    async def trainer_push_piece(self, session: TrainerSession, piece: PushPiece) -> None:
        self.node.check_trainer_push(piece)
        await self._joined.wait()
        self.node.trainer_push_piece(session.session_id, piece, self._now())
        self._after()

    def trainer_ack(self, session: TrainerSession, ack: Ack) -> None:
        self.node.trainer_ack(ack)

    def trainer_telemetry(self, session: TrainerSession, msg: Telemetry) -> None:
        self.node.trainer_telemetry(msg, self._now())

    def trainer_shards(self, session: TrainerSession, msg: ShardRequest | ShardDone) -> None:
        self.node.trainer_shards(session.session_id, msg, self._now())
        self._after()

    def trainer_params(
        self, session: TrainerSession, msg: ParamRequest | ParamAnnounce | ParamChunk | ParamRefuse
    ) -> None:
        self.node.trainer_params(session.session_id, msg, self._now())
        self._after()

    # ------------------------------------------------------------------------------------------------
    # views and control (HttpOwner)
    # ------------------------------------------------------------------------------------------------

    def apply_config(self, values: dict[str, Any], effective_iteration: int | None) -> dict[str, Any]:
        """Forward a trainer configuration update (``POST /config``); see :meth:`GatewayNode.apply_config`."""
        applied = self.node.apply_config(values, effective_iteration, self._now())
        self._after()
        return applied

    def control_token(self) -> str | None:
        return self.cfg.control_token()

    def scheduler_url(self) -> str | None:
        return self.cfg.scheduler

    def status(self) -> dict[str, Any]:
        return self.node.status()

    def metrics_text(self) -> str:
        return self.node.metrics_text()

    def stats_file(self) -> dict[str, Any]:
        """What ``--stats-file`` holds (keys read by ``wanrt demo``; see gateways.stats)."""
        return self.node.stats_file()
