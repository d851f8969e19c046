"""The site's trainer (its leader rank) as the gateway sees it: one authenticated local connection.

A thin asyncio adapter. The trainer connects to ``trainer_listen`` (role ``trainer``, the job's HMAC
handshake), pushes ``Push(iteration, layer, round=0, payload)`` per layer (or a layer in ``PushPiece`` s:
a streamed push, :mod:`wanrt.protocol.push_pieces`) and acknowledges every ``Aggregate``; the gateway
acknowledges pushes once they are counted (:mod:`gateways.membership.trainer_ledger`) and forwards
``ConfigUpdate`` s. What the pushes mean is the daemon's business (:class:`TrainerOwner`).

The gateway's Welcome ``info`` carries the job's model signature when known (keys ``model``, ``n_layers``,
``group``, ``layers``, ``model_site``; the client refuses to train another model), plus ``join_at`` (the
iteration from which this gateway runs rounds: a trainer reconnecting to a restarted gateway skips ahead to
it) and ``frontier``. A trainer that reconnects is served again: a new connection replaces the old one, and
gets every result it has not acknowledged yet and the last configuration update.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import Any, Protocol

from transports import Timeouts, Transport
from transports.connection_io import abort_and_close, next_event
from transports.connection_serving import ConnectionEnd, serve_connection
from transports.handshake_boundary import HandshakeFailure, handshake_boundary
from wanrt.errors import (
    AuthError,
    RemoteProtocolError,
    TransportError,
    WanrtError,
)
from wanrt.protocol import (
    Ack,
    Aggregate,
    Auth,
    Bye,
    Connection,
    ConnectionClosed,
    Error,
    ErrorCode,
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

__all__ = ["TrainerOwner", "TrainerSession", "serve_trainer"]

log = logging.getLogger(__name__)


class TrainerOwner(Protocol):
    """The daemon, as the trainer side needs it."""

    site: str
    job: str

    def trainer_welcome_info(self, hello: dict[str, Any]) -> dict[str, Any]:
        """The Welcome's info for a trainer whose Hello said ``hello`` (``refused`` when its run may not
        train here: the client raises at ``wanrt.init``)."""
        ...

    def trainer_model_problem(self, info: dict[str, Any]) -> str | None:
        """Why this trainer's model is not the job's (None: fine; its signature may be adopted)."""
        ...

    def trainer_auth_failed(self, reason: str) -> None:
        """A connection to the trainer socket failed to authenticate (the other sites are told)."""
        ...

    def trainer_refusal_notice(self) -> Notice | None:
        """What to tell a trainer refused after its handshake before the connection closes."""
        ...

    def trainer_connected(self, session: TrainerSession) -> None: ...

    def trainer_disconnected(self, session: TrainerSession, reason: str, *, clean: bool) -> None:
        """The session ended; ``clean``: the trainer said Bye (its run finished here), else it died."""
        ...

    async def trainer_push(self, session: TrainerSession, push: Push) -> None: ...

    async def trainer_push_piece(self, session: TrainerSession, piece: PushPiece) -> None:
        """A piece of a streamed push (checked and put together by the node)."""
        ...

    def trainer_ack(self, session: TrainerSession, ack: Ack) -> None: ...

    def trainer_telemetry(self, session: TrainerSession, msg: Telemetry) -> None: ...

    def trainer_params(
        self, session: TrainerSession, msg: ParamRequest | ParamAnnounce | ParamChunk | ParamRefuse
    ) -> None: ...

    def trainer_shards(self, session: TrainerSession, msg: ShardRequest | ShardDone) -> None:
        """A data-shard request or DONE report, relayed to the scheduler (scheduler.sharding)."""
        ...

    def secret(self) -> bytes: ...

    @property
    def timeouts(self) -> Timeouts: ...


class TrainerSession:
    """One trainer connection: an outgoing frame queue drained by a writer task, and the reader."""

    def __init__(self, conn: Connection, transport: Transport, timeouts: Timeouts) -> None:
        self.conn = conn
        self.transport = transport
        self.peer = transport.peer
        self.session_id = 0  # given by the daemon when the handshake is done
        self._timeouts = timeouts
        self._out: deque[list[memoryview]] = deque()
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._bye_sent = False
        self._refusal: str | None = None
        self.said_bye = False  # the trainer closed its run (close()): it did not die

    def send(self, msg: Message) -> None:
        """Queue a frame for the trainer (Aggregate, Ack, ConfigUpdate, Bye)."""
        if self._bye_sent:
            return
        self._out.append(self.conn.send_parts(msg))
        self._bye_sent = isinstance(msg, Bye)
        self._drained.clear()
        self._wake.set()

    @property
    def bye_sent(self) -> bool:
        return self._bye_sent

    def send_bye(self, reason: str) -> None:
        self.send(Bye(reason[:200]))

    def refuse(self, reason: str) -> None:
        """End the session with an Error frame saying ``reason`` (model mismatch, replaced connection)."""
        if self._refusal is None:
            self._refusal = reason
            self._wake.set()

    @property
    def drained(self) -> bool:
        return self._drained.is_set()

    async def wait_drained(self) -> None:
        await self._drained.wait()

    async def writer(self) -> str:
        while True:
            self._wake.clear()
            if self._refusal is not None:
                # what was queued before the refusal (a Notice saying why) goes out first
                parts = [p for frame in self._out for p in frame]
                self._out.clear()
                await self.transport.send([*parts, self.conn.abort(RemoteProtocolError(self._refusal))])
                self._drained.set()
                return self._refusal
            if not self._out:
                self._drained.set()
                if self._bye_sent:
                    return "closed by this gateway"
                await self._wake.wait()
                continue
            parts = [p for frame in self._out for p in frame]
            self._out.clear()
            await self.transport.send(parts)


async def serve_trainer(owner: TrainerOwner, transport: Transport) -> None:
    """Listener handler for ``trainer_listen``: handshake, then serve until the trainer leaves."""
    conn = Connection(
        Role.GATEWAY, owner.site, owner.job, owner.secret(), side="server", peer=f"trainer@{transport.peer}"
    )
    timeouts = owner.timeouts

    def failed(f: HandshakeFailure) -> None:
        if f.kind == "timeout":
            log.warning(
                "trainer %s: handshake not finished within %g s; closed", transport.peer, timeouts.handshake
            )
        elif f.kind == "refused":
            log.warning("trainer %s rejected: %s", transport.peer, f)
            if f.auth:
                owner.trainer_auth_failed(str(f))
        else:
            log.info("trainer %s: connection failed during the handshake: %s", transport.peer, f)

    problem: str | None = None
    async with (
        handshake_boundary(conn, transport, grace=timeouts.close, on_failure=failed) as handshake,
        asyncio.timeout(timeouts.handshake),
    ):
        problem = await _handshake(owner, conn, transport)
    if handshake.failed:
        return
    if problem is _PROBED:
        await abort_and_close(conn, transport, None, grace=timeouts.close)
        return
    if problem is not None:
        log.error("trainer %s refused: %s", transport.peer, problem)
        notice = owner.trainer_refusal_notice()
        if notice is not None:
            with contextlib.suppress(TransportError, OSError):
                await transport.send(conn.send_parts(notice))
        await abort_and_close(
            conn, transport, RemoteProtocolError(problem, code=int(ErrorCode.PROTOCOL)), grace=timeouts.close
        )
        return
    session = TrainerSession(conn, transport, timeouts)
    owner.trainer_connected(session)

    def ended(end: ConnectionEnd) -> None:
        if isinstance(end.error, WanrtError):
            log.warning("trainer %s: connection closed: %s", transport.peer, end.error)
        elif end.error is not None:
            log.error("trainer %s: internal error, connection closed", transport.peer, exc_info=end.error)
        end.clean = end.error is None and session.bye_sent  # a clean end: Bye said
        owner.trainer_disconnected(session, end.reason, clean=session.said_bye)

    await serve_connection(
        conn,
        transport,
        reader=_read(owner, session),  # the reader says why the trainer left
        writer=session.writer(),
        name=f"trainer {transport.peer}",
        grace=timeouts.close,
        on_end=ended,
    )


#: silence after which a trainer connection is taken for dead: three of the client's 5 s heartbeats
TRAINER_SILENT_S = 15.0

#: _handshake's answer for ``wanrt.init``'s probe (a Hello with ``probe``: the client only reads the
#: Welcome — the gateway's proof and whether its run may train here — and closes)
_PROBED = "probe"


async def _handshake(owner: TrainerOwner, conn: Connection, transport: Transport) -> str | None:
    """Hello → Welcome (with the job's model) → Auth. Returns a model problem to refuse the trainer for."""
    event = await next_event(conn, transport)
    if not isinstance(event, Hello):
        raise TransportError("trainer left before its Hello", peer=transport.peer)
    if event.role is not Role.TRAINER or event.site != owner.site:
        why = (
            f"{event.role} of site {event.site!r} refused: "
            f"only the trainer of site {owner.site!r} may connect here"
        )
        await transport.send([conn.reject(ErrorCode.AUTH, why)])
        raise AuthError(why, peer=transport.peer)
    hello = dict(conn.peer_info)
    await transport.send([conn.accept(owner.trainer_welcome_info(hello))])
    event = await next_event(conn, transport)
    if hello.get("probe") and isinstance(event, (ConnectionClosed, Error)):
        return _PROBED
    if isinstance(event, Error) and event.code == ErrorCode.AUTH:  # our proof did not match its secret
        raise AuthError(f"the trainer does not share this job's secret: {event.message}", peer=transport.peer)
    if not isinstance(event, Auth):
        raise TransportError("trainer left before authenticating", peer=transport.peer)
    return owner.trainer_model_problem(dict(conn.peer_info))


async def _read(owner: TrainerOwner, session: TrainerSession) -> str:
    conn, transport = session.conn, session.transport
    # the client beats every 5 s (transports.Timeouts' default: its link's own setting, not this gateway's)
    # from its link thread, whatever its training loop does; a gateway with shorter peer heartbeats must
    # not take a healthy trainer for dead
    silent = max(owner.timeouts.peer_lost_after, TRAINER_SILENT_S)
    while True:
        try:
            async with asyncio.timeout(silent):
                event = await next_event(conn, transport)
        except TimeoutError:
            return f"trainer silent for {silent:g} s (no heartbeat): taken for dead"
        if isinstance(event, Push) and not isinstance(event, Aggregate):
            await owner.trainer_push(session, event)  # checked by the node (job, site, values)
        elif isinstance(event, PushPiece):
            await owner.trainer_push_piece(session, event)
        elif isinstance(event, Ack):
            owner.trainer_ack(session, event)
        elif isinstance(event, Telemetry):
            owner.trainer_telemetry(session, event)
        elif isinstance(event, (ShardRequest, ShardDone)):
            owner.trainer_shards(session, event)
        elif isinstance(event, (ParamRequest, ParamAnnounce, ParamChunk, ParamRefuse)):
            owner.trainer_params(session, event)
        elif isinstance(event, Heartbeat):
            continue
        elif isinstance(event, Bye):
            session.said_bye = True
            session.send(Bye("served"))
            await session.wait_drained()
            return f"trainer said bye: {event.reason or 'no reason'}"
        elif isinstance(event, Error):
            return f"trainer aborted: {event.message}"
        elif isinstance(event, ConnectionClosed):
            return f"trainer connection closed ({event.reason})"
        else:
            raise RemoteProtocolError(f"a trainer may not send {type(event).__name__}", peer="trainer")
