"""The per-site gateway daemon: a thin asyncio adapter around the gateway's sans-IO parts.

Who decides what (this file decides nothing of it, it carries events in and actions out):

* :class:`~gateways.rounds.engine.RoundEngine` — every WAN round: what to send to whom, when a round is
finished,
  what is carried; driven with ``local_push`` (trainer pushes), ``peer_message``, ``tick`` (its deadlines),
  ``peer_lost`` / ``peer_joined`` (links going down and up);
* :mod:`gateways.sending.edf_queue` — in which order queued bytes go out on each link (earliest iteration,
then layer);
* :class:`~gateways.sending.rate_allocator.RateAllocator` — each link's send rate, from per-iteration link
times
  (:mod:`gateways.sending.link_times`);
* :mod:`gateways.membership.joining` — from which iteration a (re)joining gateway takes part;
* :mod:`gateways.membership.job_model` — which model signature is the job's;
* :mod:`gateways.membership.trainer_ledger` — which trainer pushes are counted, what a reconnecting trainer
is owed;
* :mod:`gateways.wire.round_frames` — how round messages map onto protocol frames.

Connections: :mod:`gateways.service.peer_links` (peer gateways), :mod:`gateways.service.peer_link` (one
peer link),
:mod:`gateways.service.trainer_session` (the site's trainer), :mod:`gateways.service.http_api` (/metrics,
/status, /config).

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
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict
from typing import Any, Final

from gateways.config import GatewayConfig
from gateways.membership.job_model import JobModelState, ModelSignature
from gateways.membership.joining import LinkInfo, initial_live, join_iteration, lost_on_suspect, rounds_digest
from gateways.membership.trainer_ledger import TrainerLedger
from gateways.rounds.engine import RoundEngine
from gateways.rounds.messages import Action, Deliver, PeerSuspect, RoundClosed, RoundMsg, Send
from gateways.rounds.topology import PlanSpec, build_plan
from gateways.sending.edf_queue import make_send_queue
from gateways.sending.link_times import LinkTimes
from gateways.sending.rate_allocator import RateAllocator
from gateways.service.codec_warmup import warm_up_codec
from gateways.service.http_api import MetricsServer
from gateways.service.peer_link import Pacer, PeerLink
from gateways.service.peer_links import PeerLinks
from gateways.service.trainer_session import TrainerSession, serve_trainer
from gateways.stats import GatewayStats, peer_view, render_prometheus
from gateways.wire.config_update import trainer_config_update
from gateways.wire.round_frames import JobModel, RoundTag
from transports import BandwidthTrace, Listener, Timeouts, Transport, listen, parse_url
from wanrt.errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from wanrt.payload import SparsePayload
from wanrt.protocol import Ack, Aggregate, ConfigUpdate, Connection, Hello, Push, Role

__all__ = ["GatewayDaemon"]

log = logging.getLogger(__name__)

#: Round messages kept for a live peer whose link is not up yet (start-up, reconnect in progress). A peer
#: that stays away this long is declared lost and the round engine re-plans without it.
MAX_BACKLOG: Final = 4096


class GatewayDaemon:
    """One site's gateway. ``on_action`` sees every round-engine action (telemetry, tests)."""

    def __init__(self, cfg: GatewayConfig, *, on_action: Callable[[Action], None] | None = None) -> None:
        self.cfg = cfg
        self.site = cfg.site
        self.job = cfg.job
        self.sites = tuple(sorted({cfg.site, *cfg.peers}))
        self._secret = cfg.secret_bytes()
        self._on_action = on_action
        self._traces = {
            p: BandwidthTrace.load(s.trace) for p, s in cfg.shaping.items() if s.trace is not None
        }
        self._rounds_digest = rounds_digest(cfg.rounds)
        self.engine: RoundEngine | None = None
        self.ledger: TrainerLedger | None = None
        self.join_at: int | None = None
        self.model = JobModelState()
        self.stats = GatewayStats(self.site, list(cfg.peers))
        self.queue = make_send_queue(cfg.edf)
        self.allocator = RateAllocator(cfg.peers, cfg.base_rates_bps(), cfg.rates)
        self.link_times = LinkTimes(settle=cfg.rounds.window + 1)
        self._links: dict[str, PeerLink] = {}
        self._backlog: dict[str, list[RoundMsg]] = {}
        self._contacted: set[str] = set()
        self._item_ids = itertools.count(1)
        self._peer_links = PeerLinks(cfg, self, self._secret)
        self._trainer_listener: Listener | None = None
        self._trainer: TrainerSession | None = None
        self._trainer_model: ModelSignature | None = None
        self._config_update: ConfigUpdate | None = None
        self._http: MetricsServer | None = None
        self._timer_task: asyncio.Task[None] | None = None
        self._timer_due: float | None = None  # the engine deadline the timer task sleeps until
        self._gate = asyncio.Lock()
        self._joined = asyncio.Event()
        self._timer_wake = asyncio.Event()
        self._progress = asyncio.Event()
        self._stop_requested = asyncio.Event()
        self._drain_task: asyncio.Task[bool] | None = None
        self._work: deque[Action] = deque()
        self._applying = False
        self._observed_frontier = -1
        self._t0 = 0.0
        self.state = "created"

    # ------------------------------------------------------------------------------------------------
    # lifecycle
    # ------------------------------------------------------------------------------------------------

    @property
    def timeouts(self) -> Timeouts:
        return self.cfg.timeouts

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    async def start(self) -> None:
        """Bring every listener up (then :meth:`ready_info` is valid) and start dialing peers."""
        self._t0 = self._now()
        await asyncio.to_thread(
            warm_up_codec
        )  # never inside the first round (see gateways.service.codec_warmup)
        try:
            trainer_url = parse_url(self.cfg.trainer_listen).url
            self._trainer_listener = await listen(
                trainer_url, lambda t: serve_trainer(self, t), timeouts=self.cfg.timeouts
            )
            await self._peer_links.start()
            if self.cfg.metrics_port:
                self._http = MetricsServer(self, self.cfg.metrics_host, self.cfg.metrics_port)
                await self._http.start()
        except BaseException:
            await self._close_endpoints()
            raise
        self._timer_task = asyncio.get_running_loop().create_task(self._timer(), name="round timer")
        if not self.cfg.peers:
            self._create_engine(0, set(self.sites))
        self.state = "joining" if self.engine is None else "running"
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
        if self.state in ("stopping", "stopped"):
            return self.stats_file()
        self.state = "stopping"
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
            log.warning(
                "phase 2 ended with %d open rounds and %d queued messages",
                0 if self.engine is None else len(self.engine.open_rounds()),
                len(self.queue),
            )
        log.info("phase 3: saying goodbye, cancelling what is left")
        closing = [
            link.close("gateway shutting down", timeout=self.cfg.timeouts.close)
            for link in self._links.values()
        ]
        if self._trainer is not None:
            self._trainer.send_bye("gateway shutting down")
        await asyncio.gather(*closing)
        if self._trainer is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.cfg.timeouts.close):
                    await self._trainer.wait_drained()
        log.info("phase 4: closing")
        await self._close_endpoints()
        self.state = "stopped"
        return self.stats_file()

    async def abort(self) -> None:
        """Drop everything at once: connections aborted (no Bye), tasks cancelled, listeners closed."""
        self.state = "stopped"
        for link in list(self._links.values()):
            _abort_transport(link.transport)
        if self._trainer is not None:
            _abort_transport(self._trainer.transport)
        await self._close_endpoints()

    async def _close_endpoints(self) -> None:
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
                    if self._trainer is not None and not self._trainer.drained:
                        await self._trainer.wait_drained()
                        continue
                    if self._idle():
                        return True
                    await self._progress.wait()
        except TimeoutError:
            return False

    def _idle(self) -> bool:
        if self.engine is not None and self.engine.open_rounds():
            return False
        return len(self.queue) == 0

    def _progressed(self) -> None:
        self._progress.set()

    # ------------------------------------------------------------------------------------------------
    # the round engine
    # ------------------------------------------------------------------------------------------------

    def _create_engine(self, start: int, live: set[str]) -> None:
        rc = self.cfg.rounds
        spec = PlanSpec.make(rc.topology, arity=rc.tree_arity, root=self.cfg.root)
        plan = spec if live >= set(self.sites) else build_plan(spec, live)
        self.engine = RoundEngine(self.site, self.sites, plan, rc, start_iteration=start)
        self.ledger = TrainerLedger(self.site, start)
        self.join_at = start
        self._observed_frontier = start - 1
        self.state = "running"
        self._joined.set()
        self._timer_wake.set()
        log.info("joined job %s at iteration %d with members %s", self.job, start, ", ".join(sorted(live)))
        # a member that never links is as silent as one whose heartbeats stopped: every gateway gives it
        # the same time, so they all count it out (and in again when it comes) alike
        t = self.cfg.timeouts
        loop = asyncio.get_running_loop()
        for peer in sorted(live - {self.site} - set(self._links)):
            loop.call_later(t.heartbeat_interval * t.heartbeat_misses, self._no_link_yet, peer)

    def _apply(self, actions: list[Action]) -> None:
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
                    self._send_round(action.peer, action.msg)
                elif isinstance(action, Deliver):
                    self._deliver(action)
                elif isinstance(action, RoundClosed):
                    self.stats.round_closed(action)
                    if not action.delivered:
                        self._answer_empty(action.iteration, action.layer)
                elif isinstance(action, PeerSuspect):
                    self._suspect(action)
        finally:
            self._applying = False
        if self.engine is not None:
            due = self.engine.next_deadline()
            if due is not None and (self._timer_due is None or due < self._timer_due):
                self._timer_wake.set()  # an earlier deadline than the timer sleeps until
        self._progressed()
        self._observe_link_times()

    async def _timer(self) -> None:
        """Call ``engine.tick`` at ``engine.next_deadline()``; woken early whenever actions were applied."""
        loop = asyncio.get_running_loop()
        while True:
            self._timer_wake.clear()
            due = self._timer_due = None if self.engine is None else self.engine.next_deadline()
            if due is None:
                await self._timer_wake.wait()
                continue
            delay = due - loop.time()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._timer_wake.wait()
                continue
            assert self.engine is not None
            self._timer_due = None
            self._apply(self.engine.tick(loop.time()))

    def _send_round(self, peer: str, msg: RoundMsg) -> None:
        link = self._links.get(peer)
        if link is not None and link.up:
            try:
                link.send_round(msg)
            except ProtocolError as exc:
                log.error("cannot frame a round message for %s: %s; closing that link", peer, exc)
                _abort_transport(link.transport)
            return
        assert self.engine is not None
        if peer not in self.engine.live:
            return  # lost: the engine re-planned the round without it
        backlog = self._backlog.setdefault(peer, [])
        backlog.append(msg)
        if len(backlog) > MAX_BACKLOG:
            self._declare_lost(peer, f"no link for {MAX_BACKLOG} queued round messages")

    def _deliver(self, d: Deliver) -> None:
        assert self.ledger is not None
        acks = self.ledger.on_deliver(d.layer, d.sites)
        if d.payload is None:
            log.debug("round %s of layer %d has no payload at all; nothing to deliver", d.iteration, d.layer)
            return
        self.ledger.answer(d.iteration, d.layer)
        sites = tuple(sorted({s for s, _ in d.sites})) or (self.site,)
        self._to_trainer(Aggregate(self.job, d.iteration, d.layer, 0, self.site, d.payload, sites))
        self.stats.aggregates_delivered += 1
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
        self.ledger.retain(msg)
        if self._trainer is not None:
            self._trainer.send(msg)

    def _suspect(self, s: PeerSuspect) -> None:
        self.stats.suspects += 1
        link = self._links.get(s.peer)
        if lost_on_suspect(link is not None and link.up):
            self._declare_lost(s.peer, f"silent for {s.waited:.1f} s and no link ({s.reason})")
        else:
            log.info(
                "peer %s slow: round (%d, %d) waited %.1f s for it (%s); its link is up",
                s.peer,
                s.iteration,
                s.layer,
                s.waited,
                s.reason,
            )

    def _no_link_yet(self, peer: str) -> None:
        if peer not in self._links and self.state == "running":
            t = self.cfg.timeouts
            self._declare_lost(
                peer, f"no link within {t.heartbeat_interval * t.heartbeat_misses:g} s of joining"
            )

    def _declare_lost(self, peer: str, reason: str) -> None:
        if self.engine is None or peer not in self.engine.live:
            return
        dropped = self._backlog.pop(peer, [])
        self.stats.peer_state(peer, "lost", self._now(), reason)
        log.warning(
            "peer %s lost: %s; the round engine re-plans without it (%d unsent messages re-planned)",
            peer,
            reason,
            len(dropped),
        )
        self._apply(self.engine.peer_lost(peer, self._now()))

    def set_plan(self, spec: PlanSpec, effective_iteration: int | None = None) -> None:
        """Adopt a topology from ``effective_iteration`` on (every unfinished round if None), e.g. a
        straggler re-attached under parent-child. The scheduler will call this; every gateway must be told
        the same spec and iteration."""
        if self.engine is None:
            raise LocalProtocolError("set_plan before this gateway joined the job")
        self._apply(self.engine.set_plan(spec, self._now(), effective_iteration))

    def _observe_link_times(self) -> None:
        engine = self.engine
        if engine is None or engine.frontier == self._observed_frontier:
            return
        self._observed_frontier = engine.frontier
        for iteration, times in self.link_times.ready(engine.frontier, self._now()):
            rates = self.allocator.observe(iteration, times)
            for peer, rate in rates.items():
                link = self._links.get(peer)
                if link is not None:
                    link.set_rate(rate)

    # ------------------------------------------------------------------------------------------------
    # peer links (LinksOwner, LinkOwner)
    # ------------------------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def handshake_gate(self) -> AsyncIterator[None]:
        """Serialise handshakes until this gateway has joined (its first link fixes its start)."""
        if self.engine is not None:
            yield
            return
        async with self._gate:
            yield

    def dialer_problem(self, hello: Hello) -> str | None:
        if hello.role is not Role.GATEWAY:
            return f"this is the gateway listener of site {self.site!r}; role {hello.role} connects elsewhere"
        if hello.site not in self.cfg.peers:
            return f"site {hello.site!r} is not a peer of site {self.site!r} in this job"
        if not hello.site < self.site:
            return f"site {hello.site!r} must accept the connection: the smaller site name dials"
        return None

    def link_info(self, peer: str) -> dict[str, Any]:
        engine = self.engine
        join_at = self.join_at if engine is not None and peer not in self._contacted else None
        info = LinkInfo(
            frontier=-1 if engine is None else engine.frontier,
            fresh=engine is None,
            join_at=join_at,
            live=None if engine is None else tuple(engine.live),
        ).to_info()
        info["rounds"] = self._rounds_digest
        info.update(self.model.info())
        return info

    def link_up(
        self, peer: str, conn: Connection, transport: Transport, ours: dict[str, Any], theirs: dict[str, Any]
    ) -> PeerLink:
        if theirs.get("rounds") != self._rounds_digest:
            raise RemoteProtocolError(
                f"site {peer} runs different [gateway.rounds] settings; every site must use the same",
                peer=peer,
            )
        mine, other = LinkInfo.parse(ours, peer=self.site), LinkInfo.parse(theirs, peer=peer)
        sig = ModelSignature.from_info(theirs, site=None, peer=peer)
        now = self._now()
        old = self._links.get(peer)
        if old is not None:
            old.retired = True
            _abort_transport(old.transport)
            self._link_gone(old, "replaced by a new connection from the same peer")
        link = PeerLink(
            peer,
            conn,
            transport,
            owner=self,
            queue=self.queue,
            item_ids=self._item_ids,
            pacer=Pacer(self.allocator.rates()[peer], now),
            link_times=self.link_times,
            counters=self.stats.peers[peer].counters,
            timeouts=self.cfg.timeouts,
            trace=self._traces.get(peer),
            trace_start=self._t0,
            on_progress=self._progressed,
        )
        self._links[peer] = link
        self._contacted.add(peer)
        self.stats.peer_state(peer, "up", now)
        self._progressed()
        log.info("link to gateway %s up (%s)", peer, transport.peer)
        if sig is not None:
            self._offer_model(sig, theirs.get("model_established") is True, source=link)
        elif self.model.current is not None:
            link.send_control(JobModel(self.model.info()))
        margin = self.cfg.rounds.window
        if self.engine is None:
            self._create_engine(
                join_iteration(mine, other, margin=margin), initial_live(self.site, peer, other, self.sites)
            )
        elif peer not in self.engine.live:
            at = join_iteration(mine, other, margin=margin)
            log.info("gateway %s rejoins the job at iteration %d", peer, at)
            self._apply(self.engine.peer_joined(peer, now, at))
        for msg in self._backlog.pop(peer, []):
            link.send_round(msg)
        return link

    def link_down(self, link: PeerLink) -> None:
        if link.retired:
            return
        self._link_gone(link, link.reason)

    def _link_gone(self, link: PeerLink, reason: str) -> None:
        peer = link.peer
        if self._links.get(peer) is link:
            del self._links[peer]
        self.queue.cancel_peer(peer)  # the round engine re-plans what was queued (it keeps its own data)
        self.link_times.drop_peer(peer)
        self._progressed()
        if self.state in ("stopping", "stopped"):
            self.stats.peer_state(peer, "down", self._now(), reason)
            log.info("link to %s closed: %s", peer, reason)
            return
        if self.engine is not None and peer in self.engine.live:
            self._declare_lost(peer, reason)
        else:
            self.stats.peer_state(peer, "down", self._now(), reason)
            log.warning("link to %s down: %s", peer, reason)

    def rejected(self, who: str, why: str) -> None:
        self.stats.rejected_connections += 1
        log.warning("connection from %s rejected: %s", who, why)

    def on_round_message(self, link: PeerLink, tag: RoundTag, msg: RoundMsg) -> None:
        engine, ledger = self.engine, self.ledger
        assert engine is not None and ledger is not None  # a link is up only once the engine exists
        if msg.kind == "outcome":
            self._send_push_acks(ledger.on_outcome(msg.layer, msg.step, msg.iteration, msg.sites))
        self._apply(engine.peer_message(link.peer, msg, self._now()))

    def on_ack(self, link: PeerLink, ack: Ack, seq: int) -> None:
        self.link_times.acked_through(link.peer, seq, self._now())

    def on_job_model(self, link: PeerLink, info: dict[str, Any]) -> None:
        sig = ModelSignature.from_info(info, site=None, peer=link.peer)
        if sig is None:
            raise RemoteProtocolError("JobModel without a signature", peer=link.peer)
        self._offer_model(sig, info.get("model_established") is True, source=link)

    def _offer_model(self, sig: ModelSignature, established: bool, *, source: PeerLink | None) -> None:
        self._progressed()
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
            for link in self._links.values():
                if link is not source:
                    link.send_control(JobModel(self.model.info()))
        if (
            self._trainer is not None
            and self._trainer_model is not None
            and not cur.same_model(self._trainer_model)
        ):
            log.error("this site's trainer runs a different model than the job's; closing its connection")
            self._trainer.refuse(
                f"this site's model differs from the job's model (as trained by site {cur.site})"
            )

    # ------------------------------------------------------------------------------------------------
    # the trainer (TrainerOwner)
    # ------------------------------------------------------------------------------------------------

    def secret(self) -> bytes:
        return self._secret

    def trainer_welcome_info(self) -> dict[str, Any]:
        info = self.model.info()
        info["frontier"] = -1 if self.engine is None else self.engine.frontier
        info["join_at"] = -1 if self.join_at is None else self.join_at
        return info

    def trainer_model_problem(self, info: dict[str, Any]) -> str | None:
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
            return f"this site's model differs from the job's model (as trained by site {cur.site})"
        if outcome != "same" or before is None:
            for link in self._links.values():
                link.send_control(JobModel(self.model.info()))
        self._trainer_model = sig
        return None

    def trainer_connected(self, session: TrainerSession) -> None:
        old = self._trainer
        if old is not None:
            log.warning("a new trainer connection replaces the one from %s", old.peer)
            old.refuse("replaced by a new connection of this site's trainer")
        self._trainer = session
        self._progressed()
        self.stats.trainer_connections += 1
        log.info("trainer connected (%s)", session.peer)
        if self.ledger is not None:
            for msg in self.ledger.unacked_aggregates():
                session.send(msg)
        if self._config_update is not None:
            session.send(self._config_update)

    def trainer_disconnected(self, session: TrainerSession, reason: str) -> None:
        if self._trainer is session:
            self._trainer = None
        self._progressed()
        log.info("trainer %s disconnected: %s", session.peer, reason)

    async def trainer_push(self, session: TrainerSession, push: Push) -> None:
        await self._joined.wait()  # rounds start once this gateway has joined the job
        engine, ledger = self.engine, self.ledger
        assert engine is not None and ledger is not None
        self.stats.trainer_pushes += 1
        verdict = ledger.on_push(push.iteration, push.layer, push.payload)
        if verdict.acks:
            self._send_push_acks(verdict.acks, session)
        if verdict.push is not None:
            it, layer, payload = verdict.push
            self._apply(engine.local_push(it, layer, payload, self._now()))
            if (it, layer) not in engine.open_rounds():
                self._answer_empty(it, layer)  # carried: its round is over here (no-op if answered)
            if not self.model.established and self.model.current is not None:
                self.model.establish()

    def trainer_ack(self, session: TrainerSession, ack: Ack) -> None:
        if self.ledger is not None:
            self.ledger.aggregate_acked(ack.iteration, ack.layer)

    def _send_push_acks(
        self, acks: tuple[tuple[int, int], ...], session: TrainerSession | None = None
    ) -> None:
        target = session or self._trainer
        if target is None:
            return
        for it, layer in acks:
            target.send(Ack(it, layer, 0))

    # ------------------------------------------------------------------------------------------------
    # views and control (HttpOwner)
    # ------------------------------------------------------------------------------------------------

    def apply_config(self, values: dict[str, Any], effective_iteration: int | None) -> dict[str, Any]:
        """Forward a trainer configuration update (``POST /config``); returns what was applied. Without an
        iteration it takes effect ahead of every site's frontier."""
        if effective_iteration is None:
            frontier = -1 if self.engine is None else self.engine.frontier
            effective_iteration = frontier + self.cfg.rounds.window + 1
        msg = trainer_config_update(values, effective_iteration)
        self._config_update = msg
        if self._trainer is not None:
            self._trainer.send(msg)
        return {
            "values": msg.values,
            "effective_iteration": msg.effective_iteration,
            "forwarded": self._trainer is not None,
        }

    def status(self) -> dict[str, Any]:
        engine = self.engine
        snap = self.allocator.snapshot()
        queue = self.queue.stats()
        live = set() if engine is None else set(engine.live)
        queues = queue.peers
        peers = {
            p: peer_view(st, snap.links[p], queues.get(p), live=p in live, t0=self._t0)
            for p, st in self.stats.peers.items()
        }
        return {
            "site": self.site,
            "job": self.job,
            "state": self.state,
            "frontier": -1 if engine is None else engine.frontier,
            "join_at": self.join_at,
            "open_rounds": 0 if engine is None else len(engine.open_rounds()),
            "live": sorted(live),
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


def _abort_transport(transport: Transport) -> None:
    """Drop a connection at once (TCP: reset); transports without ``abort`` are closed in the background."""
    abort = getattr(transport, "abort", None)
    if callable(abort):
        abort()
