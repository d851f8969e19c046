"""The scheduler daemon: sockets, the loop, HTTP and signals around one
:class:`~scheduler.node.SchedulerNode`.

Gateways dial it (role ``gateway``, the job's HMAC handshake; only the job's sites are accepted) and keep one
connection each; what they send goes to the node with the loop's time, what the node sends goes out. The
HTTP endpoint serves ``GET /status`` (JSON), ``GET /metrics`` (Prometheus) and ``POST /config`` (a manual
change, announced like any decision).

With a decisions file (``wanrt scheduler --decisions-file PATH``) the daemon appends one JSON line per
committed (or adopted) decision and one per decide tick, so what the scheduler chose and what it believed
about the WAN can be plotted against the link afterwards (``wanrt demo`` does): see :class:`DecisionsFile`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import IO, Any

from scheduler.daemon_config import SchedulerDaemonConfig
from scheduler.node import DecisionPolicy, SchedulerNode, SendTo
from scheduler.sharding.service import ShardService
from scheduler.sharding.state_file import read_state, write_state
from transports import Listener, Transport, listen, parse_url
from transports.connection_io import next_event
from transports.connection_serving import ConnectionEnd, serve_connection
from transports.handshake_boundary import HandshakeFailure, handshake_boundary
from wanrt.errors import AuthError, ConfigError, ProtocolError, TransportError
from wanrt.protocol import (
    Auth,
    Bye,
    Connection,
    ConnectionClosed,
    Error,
    ErrorCode,
    Heartbeat,
    Hello,
    Message,
    Role,
)
from wanrt.protocol.job_settings import JobSettings
from wanrt.protocol.scheduler.messages import SCHEDULER_REGISTRY

__all__ = ["DecisionsFile", "SchedulerDaemon", "serving"]

log = logging.getLogger(__name__)


class _Session:
    """One gateway's connection: an outgoing queue drained by a writer task."""

    def __init__(self, site: str, conn: Connection, transport: Transport) -> None:
        self.site, self.conn, self.transport = site, conn, transport
        self.out: deque[Message] = deque()
        self.wake = asyncio.Event()

    def send(self, msg: Message) -> None:
        self.out.append(msg)
        self.wake.set()

    async def writer(self) -> str:
        while True:
            self.wake.clear()
            if not self.out:
                await self.wake.wait()
                continue
            parts = [p for m in self.out for p in self.conn.send_parts(m)]
            self.out.clear()
            await self.transport.send(parts)


class DecisionsFile:
    """JSON lines of what the scheduler decided and believed, for plots and benchmarks.

    Each line: ``time`` (epoch s), ``monotonic`` (the system's monotonic clock, comparable with other
    processes' ``time.monotonic()`` on this host), ``kind`` (``commit``: every connected gateway committed
    it; ``adopted``: a restarted scheduler took over what the gateways run; ``tick``: the policy was asked to
    decide), ``decision``, ``effective_iteration``, ``values`` (commits only) and
    ``bandwidth_estimate_bps``: the adaptive policy's estimate once it has built its controller (None
    before, and for policies without one). A tick also says what the estimator's last update did
    (``bandwidth_step``: raise/lower/hold) when it updated since the previous line, so a reader can count
    estimator updates ("decisions" of §4.1's loop) rather than ticks, and ``observed``: what the estimator
    was fed at that update (the critical rank's compute, iteration time, idle, payload, exchange latency L).
    Lines are flushed as written: a reader
    may follow the file while the daemon runs, and a killed daemon leaves every line but the last whole.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._fh: IO[str] | None = path.open("a", encoding="utf-8")
        except OSError as exc:
            raise ConfigError(
                f"cannot open the decisions file {path}: {exc.strerror}", key="--decisions-file"
            ) from None
        self._last_step: object = None
        self._last_seen: object = None

    def write(self, node: SchedulerNode, policy: DecisionPolicy | None, kind: str) -> None:
        if self._fh is None:
            return
        cur = node.current
        controller = getattr(policy, "policy", None)
        estimate = getattr(controller, "bandwidth_estimate_bps", None)
        rec: dict[str, Any] = {
            "time": time.time(),
            "monotonic": time.monotonic(),
            "kind": kind,
            "decision": None if cur is None else cur.id,
            "effective_iteration": None if cur is None else cur.effective_iteration,
            "bandwidth_estimate_bps": (
                float(estimate) if isinstance(estimate, (int, float)) and math.isfinite(estimate) else None
            ),
        }
        if kind != "tick" and cur is not None:
            rec["values"] = cur.values.to_wire()
            mode_plan = getattr(policy, "last_mode_plan", None)  # the exchange mode's plan, if chosen
            if mode_plan is not None:
                rec["mode_plan"] = mode_plan.view()
            made = getattr(controller, "last_decision", None)
            if made is not None:
                # why this plan (a bandwidth change, the warm-up's next stage, ...) and what it was made
                # for: the plot's bottom panel and a user reading the file see the reason beside the values
                rec["reason"] = str(getattr(made, "reason", ""))
                rec["plan"] = {
                    "bandwidth_bps": getattr(made, "bandwidth_bps", None),
                    "target_density": getattr(made, "target_density", None),
                    "predicted_compute_s": getattr(made, "predicted_compute_s", None),
                    "predicted_exchange_s": getattr(made, "predicted_exchange_s", None),
                }
        step = getattr(controller, "last_bandwidth_step", None)
        if step is not None and step is not self._last_step:
            self._last_step = step
            rec["bandwidth_step"] = str(getattr(step, "kind", ""))
        seen = getattr(controller, "last_observation", None)
        if isinstance(seen, dict) and seen is not self._last_seen:
            self._last_seen = seen
            rec["observed"] = dict(seen)
        self._fh.write(json.dumps(rec, sort_keys=True, default=str) + "\n")
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class SchedulerDaemon:
    """See the module docstring."""

    def __init__(
        self,
        cfg: SchedulerDaemonConfig,
        *,
        policy: DecisionPolicy | None = None,
        decisions_file: Path | None = None,
    ) -> None:
        self.cfg = cfg
        self._decisions = None if decisions_file is None else DecisionsFile(decisions_file)
        self._logged: object = None  # the Decision last written to the decisions file
        self._committed_logged = 0  # decisions_committed when it was written
        self._creds = cfg.credentials()
        self._policy = policy
        self.node = SchedulerNode(cfg, 0.0, policy=policy)
        self._sessions: dict[str, _Session] = {}
        self._listener: Listener | None = None
        self._http: Any = None
        self._timer_task: asyncio.Task[None] | None = None
        self._shards_task: asyncio.Task[None] | None = None
        self._timer_wake = asyncio.Event()
        self._progress = asyncio.Event()
        self._stop = asyncio.Event()

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    async def start(self) -> None:
        self.node = SchedulerNode(self.cfg, self._now(), policy=self._policy)
        self._restore_shards()
        self._listener = await listen(
            parse_url(self.cfg.listen).url, self._accept, timeouts=self.cfg.timeouts
        )
        if self.cfg.metrics_port:
            from scheduler.service.http import SchedulerHttp

            self._http = SchedulerHttp(self, self.cfg.metrics_host, self.cfg.metrics_port)
            await self._http.start()
        self._timer_task = asyncio.get_running_loop().create_task(self._timer(), name="scheduler timer")
        if self.cfg.sharding.state_file is not None:
            self._shards_task = asyncio.get_running_loop().create_task(
                self._save_shards_loop(), name="shard snapshots"
            )
        log.info("scheduler of job %s up on %s", self.cfg.job, self._listener.url)

    def ready_info(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "job": self.cfg.job,
            "listen": None if self._listener is None else self._listener.url,
            "metrics_url": None if self._http is None else self._http.url,
        }

    def request_stop(self) -> None:
        self._stop.set()

    async def run(self, *, on_ready: Callable[[], None] | None = None) -> None:
        await self.start()
        try:
            if on_ready is not None:
                on_ready()
            await self._stop.wait()
        finally:
            await self.stop()

    async def stop(self) -> None:
        """Stop accepting, say Bye to every gateway (they keep training with the last decision), close."""
        if self._listener is not None:
            self._listener.close()
        for session in list(self._sessions.values()):
            session.send(Bye("scheduler shutting down"))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.cfg.timeouts.close):
                while any(s.out for s in self._sessions.values()):
                    self._progress.clear()
                    await self._progress.wait()
        if self._timer_task is not None:
            self._timer_task.cancel()
            await asyncio.gather(self._timer_task, return_exceptions=True)
        if self._shards_task is not None:
            self._shards_task.cancel()
            await asyncio.gather(self._shards_task, return_exceptions=True)
            self._save_shards()
        if self._listener is not None:
            await self._listener.aclose()
        if self._http is not None:
            await self._http.aclose()
        if self._decisions is not None:
            self._decisions.close()

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        """Until ``predicate()`` holds, re-checked whenever the node changed (tests, tools)."""
        while not predicate():
            self._progress.clear()
            await self._progress.wait()

    # -- the shard service's snapshot ------------------------------------------------------------------

    def _restore_shards(self) -> None:
        """Progress of an earlier scheduler of this job (AntDT §IV-C3: DONE shards are not trained again)."""
        sc = self.cfg.sharding
        if sc.state_file is None:
            return
        data = read_state(sc.state_file)
        if data is not None:
            self.node.shards = ShardService.restore(sc, data)
            log.info("shard state restored from %s: %s", sc.state_file, self.node.shards.counts())

    def _save_shards(self) -> None:
        path = self.cfg.sharding.state_file
        if path is None or not self.node.shards.dirty:
            return
        try:
            write_state(path, self.node.shards.snapshot())
        except OSError as exc:
            log.error("cannot write the shard state file %s: %s", path, exc)

    async def _save_shards_loop(self) -> None:
        """At most one snapshot per ``snapshot_interval_s``: what a crash loses is re-trained, not lost."""
        while True:
            await asyncio.sleep(self.cfg.sharding.snapshot_interval_s)
            self._save_shards()

    # -- the node's actions, its timer -----------------------------------------------------------------

    def _after(self) -> None:
        for action in self.node.pop_actions():
            if isinstance(action, SendTo):
                session = self._sessions.get(action.site)
                if session is not None:
                    session.send(action.msg)
        cur = self.node.current
        if self._decisions is not None and cur is not None and cur is not self._logged:
            committed = self.node.stats.decisions_committed
            kind = "commit" if committed > self._committed_logged else "adopted"
            self._committed_logged = committed
            self._logged = cur
            self._decisions.write(self.node, self._policy, kind)
        self._timer_wake.set()
        self._progress.set()

    async def _timer(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._timer_wake.clear()
            due = self.node.next_deadline()
            delay = None if due is None else due - loop.time()
            if delay is not None and delay <= 0:
                self.node.tick(loop.time())
                self._after()
                if self._decisions is not None:
                    self._decisions.write(self.node, self._policy, "tick")
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._timer_wake.wait()

    # -- control ---------------------------------------------------------------------------------------

    def control_token(self) -> str | None:
        return self.cfg.control_token()

    def request(self, values: dict[str, Any]) -> dict[str, Any]:
        """``POST /config {"values": ...}``: the JSON's flat settings, read by the schema (ConfigError
        names a bad key), then announced."""
        out = self.node.request(JobSettings.from_wire(values), self._now())
        self._after()
        return out

    def release(self, keys: list[str] | None) -> dict[str, Any]:
        """``POST /config {"release": ...}``: held manual values go back to the policy."""
        out = self.node.release(keys)
        self._after()
        return out

    def status(self) -> dict[str, Any]:
        st = self.node.status(self._now())
        # what the adaptive policy believes and why it planned what it did (absent for other policies)
        controller = getattr(self._policy, "policy", None)
        estimate = getattr(controller, "bandwidth_estimate_bps", None)
        if isinstance(estimate, (int, float)) and math.isfinite(estimate):
            st["bandwidth_estimate_bps"] = float(estimate)
        mode_plan = getattr(self._policy, "last_mode_plan", None)  # the exchange mode's plan, if chosen
        if mode_plan is not None:
            st["mode_plan"] = mode_plan.view()
        made = getattr(controller, "last_decision", None)
        if made is not None:
            st["last_plan"] = {
                "reason": str(getattr(made, "reason", "")),
                "bandwidth_bps": getattr(made, "bandwidth_bps", None),
                "density": getattr(made, "density", None),
                "target_density": getattr(made, "target_density", None),
                "predicted_compute_s": getattr(made, "predicted_compute_s", None),
                "predicted_exchange_s": getattr(made, "predicted_exchange_s", None),
            }
        return st

    def metrics_text(self) -> str:
        st = self.status()
        lines = [
            "# HELP wanrt_scheduler_decisions_committed Decisions every connected gateway committed",
            "# TYPE wanrt_scheduler_decisions_committed counter",
            f"wanrt_scheduler_decisions_committed {st['stats']['decisions_committed']}",
            "# HELP wanrt_scheduler_decisions_aborted Decisions aborted (a gateway too far ahead, no reply)",
            "# TYPE wanrt_scheduler_decisions_aborted counter",
            f"wanrt_scheduler_decisions_aborted {st['stats']['decisions_aborted']}",
            "# HELP wanrt_scheduler_gateway_connected Whether a site's gateway is connected",
            "# TYPE wanrt_scheduler_gateway_connected gauge",
        ]
        for site, g in st["gateways"].items():
            lines.append(f'wanrt_scheduler_gateway_connected{{site="{site}"}} {int(g["connected"])}')
        shards = st["shards"]
        lines += [
            "# HELP wanrt_scheduler_shards Data shards of the current epoch by state",
            "# TYPE wanrt_scheduler_shards gauge",
            *(f'wanrt_scheduler_shards{{state="{k}"}} {shards[k]}' for k in ("todo", "doing", "done")),
            "# HELP wanrt_scheduler_shards_repeated Shards done after being handed out more than once",
            "# TYPE wanrt_scheduler_shards_repeated counter",
            f"wanrt_scheduler_shards_repeated {shards['stats']['repeated']}",
        ]
        return "\n".join(lines) + "\n"

    # -- gateways --------------------------------------------------------------------------------------

    async def _accept(self, transport: Transport) -> None:
        conn = Connection(
            Role.SCHEDULER,
            "scheduler",
            self.cfg.job,
            self._creds.placeholder(),
            side="server",
            registry=SCHEDULER_REGISTRY,
            peer=transport.peer,
        )
        timeouts = self.cfg.timeouts

        def failed(f: HandshakeFailure) -> None:
            log.warning("gateway connection from %s refused: %s", transport.peer, f)

        async with (
            handshake_boundary(conn, transport, grace=timeouts.close, on_failure=failed) as handshake,
            asyncio.timeout(timeouts.handshake),
        ):
            hello = await next_event(conn, transport)
            if not isinstance(hello, Hello):
                raise TransportError("closed before its Hello", peer=transport.peer)
            problem = self.node.gateway_problem(hello.site)
            if hello.role is not Role.GATEWAY:
                problem = f"role {hello.role} may not connect to the scheduler"
            if problem is not None:
                await transport.send([conn.reject(ErrorCode.AUTH, problem)])
                raise AuthError(problem, peer=hello.site)
            key = self._creds.for_site(hello.site)
            if key is None:  # gateway_problem refused sites outside the job already
                raise AuthError(f"no key for site {hello.site!r}", peer=hello.site)
            await transport.send([conn.accept({}, secret=key)])
            auth = await next_event(conn, transport)
            if not isinstance(auth, Auth):
                raise TransportError("left before authenticating", peer=hello.site)
        if handshake.failed:
            return
        site = hello.site
        old = self._sessions.get(site)
        if old is not None:
            abort = getattr(old.transport, "abort", None)
            if callable(abort):
                abort()
        session = _Session(site, conn, transport)
        self._sessions[site] = session
        self.node.gateway_up(site, self._now())
        self._after()
        await self._serve(session)

    async def _serve(self, session: _Session) -> None:
        def ended(end: ConnectionEnd) -> None:
            if self._sessions.get(session.site) is session:
                del self._sessions[session.site]
                self.node.gateway_down(session.site, self._now())
                self._after()

        end = await serve_connection(
            session.conn,
            session.transport,
            reader=self._read(session),
            writer=session.writer(),
            name=session.site,
            grace=self.cfg.timeouts.close,
            on_end=ended,
        )
        log.info("gateway %s disconnected: %s", session.site, end.reason)

    async def _read(self, session: _Session) -> str:
        while True:
            event = await next_event(session.conn, session.transport)
            if isinstance(event, Heartbeat):
                continue
            if isinstance(event, Bye):
                return f"gateway said bye: {event.reason}"
            if isinstance(event, Error):
                return f"gateway aborted: {event.message}"
            if isinstance(event, ConnectionClosed):
                return f"connection closed ({event.reason})"
            try:
                self.node.on_message(session.site, event, self._now())
            except ConfigError as exc:  # a value outside the shared schema: that gateway's problem
                raise ProtocolError(str(exc)) from None
            self._after()


@contextlib.asynccontextmanager
async def serving(
    cfg: SchedulerDaemonConfig, *, policy: DecisionPolicy | None = None
) -> AsyncIterator[SchedulerDaemon]:
    """A scheduler daemon listening in this event loop for the duration of the block (tests, tools)."""
    d = SchedulerDaemon(cfg, policy=policy)
    task = asyncio.create_task(d.run())
    await d.wait_for(lambda: d._listener is not None)
    try:
        yield d
    finally:
        d.request_stop()
        await asyncio.wait_for(task, 20)
