"""The gateway's connection to the job's scheduler: dial with backoff, the job-secret handshake, a reader
and a writer. Decides nothing: what arrives goes to :meth:`GatewayNode.scheduler_message`, what the node
wants sent (:class:`~gateways.node.ToScheduler`) goes out; while the scheduler is away training goes on with
the last committed decision and reports are dropped (they are periodic).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable

from gateways.config import GatewayConfig
from transports import Transport, connect, parse_url
from transports.connection_io import next_event
from transports.connection_serving import ConnectionEnd, serve_connection
from transports.handshake_boundary import HandshakeFailure, handshake_boundary
from wanrt.errors import AuthError, RemoteProtocolError, TransportError, WanrtTimeout
from wanrt.protocol import Bye, Connection, ConnectionClosed, Error, Heartbeat, Message, Reject, Role, Welcome
from wanrt.protocol.scheduler.messages import SCHEDULER_REGISTRY

__all__ = ["SchedulerLink"]

log = logging.getLogger(__name__)


class SchedulerLink:
    """See the module docstring. ``on_up``/``on_down``/``on_message`` are the daemon's, called with the
    loop's time by the daemon itself."""

    def __init__(
        self,
        cfg: GatewayConfig,
        secret: bytes,
        *,
        on_up: Callable[[], None],
        on_down: Callable[[str], None],
        on_message: Callable[[Message], None],
    ) -> None:
        assert cfg.scheduler is not None
        self.cfg = cfg
        self.url = parse_url(cfg.scheduler).url
        self._secret = secret
        self._on_up, self._on_down, self._on_message = on_up, on_down, on_message
        self._out: deque[Message] = deque(maxlen=256)  # bounded: a stalled scheduler must not grow it
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.connected = False

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._dial_loop(), name="scheduler link")

    def send(self, msg: Message) -> None:
        if self.connected:
            self._out.append(msg)
            self._wake.set()

    async def aclose(self) -> None:
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _dial_loop(self) -> None:
        cfg = self.cfg
        delay = cfg.reconnect_initial_s
        while not self._stop.is_set():
            reason = await self._session()
            if reason is not None:
                delay = cfg.reconnect_initial_s  # it was up: start backing off afresh
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._stop.wait()
            delay = min(delay * cfg.reconnect_factor, cfg.reconnect_max_s)

    async def _session(self) -> str | None:
        """One connection: handshake, then serve until it ends; returns why it ended (None: never up)."""
        cfg = self.cfg
        try:
            transport = await connect(self.url, tls=cfg.tls, timeouts=cfg.timeouts)
        except (TransportError, WanrtTimeout, OSError) as exc:
            log.debug("cannot reach the scheduler at %s: %s", self.url, exc)
            return None
        conn = Connection(
            Role.GATEWAY,
            cfg.site,
            cfg.job,
            self._secret,
            side="client",
            registry=SCHEDULER_REGISTRY,
            peer="scheduler",
        )

        def failed(f: HandshakeFailure) -> None:
            log.warning("scheduler at %s: handshake failed: %s", self.url, f)

        async with (
            handshake_boundary(conn, transport, grace=1.0, on_failure=failed) as handshake,
            asyncio.timeout(cfg.timeouts.handshake),
        ):
            await transport.send([conn.hello({})])
            welcome = await next_event(conn, transport)
            if isinstance(welcome, Reject):
                raise RemoteProtocolError(f"the scheduler refused this gateway: {welcome.reason}")
            if not isinstance(welcome, Welcome) or welcome.role is not Role.SCHEDULER:
                raise AuthError(f"{self.url} is not the job's scheduler", peer="scheduler")
            await transport.send([conn.authenticate()])
        if handshake.failed:
            return None
        self.connected = True
        self._out.clear()
        log.info("scheduler link up (%s)", self.url)
        self._on_up()

        def ended(end: ConnectionEnd) -> None:
            self.connected = False
            log.warning("scheduler link down: %s; training goes on with the last decision", end.reason)
            self._on_down(end.reason)

        end = await serve_connection(
            conn,
            transport,
            reader=self._read(conn, transport),
            writer=self._write(conn, transport),
            name="scheduler",
            grace=1.0,
            on_end=ended,
        )
        return end.reason

    async def _read(self, conn: Connection, transport: Transport) -> str:
        while True:
            event = await next_event(conn, transport)
            if isinstance(event, Heartbeat):
                continue
            if isinstance(event, Bye):
                return f"scheduler said bye: {event.reason}"
            if isinstance(event, Error):
                return f"scheduler aborted the link: {event.message}"
            if isinstance(event, ConnectionClosed):
                return f"connection closed ({event.reason})"
            self._on_message(event)

    async def _write(self, conn: Connection, transport: Transport) -> str:
        while True:
            self._wake.clear()
            if not self._out:
                await self._wake.wait()
                continue
            parts = [p for msg in self._out for p in conn.send_parts(msg)]
            self._out.clear()
            await transport.send(parts)
