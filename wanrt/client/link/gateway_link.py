"""The site leader's real link to its gateway: transport + sans-IO protocol in one background thread.

Why a thread with its own event loop: the training loop is synchronous PyTorch code and must never wait
on the network except where partial staleness says it must (:mod:`wanrt.client.leader.staleness`). The
thread runs a plain asyncio loop (never uvloop: installing a loop policy is the daemons' business, not a
library's) with three tasks: a writer that frames queued pushes with the :class:`~wanrt.protocol.Connection`,
a reader that turns Aggregate / ConfigUpdate frames into :mod:`~wanrt.client.link.api` events on a
thread-safe queue, and a heartbeat. The training thread only touches two queues and a stored error.

Handshake (role ``trainer``, HMAC proof of the job secret, docs/protocol.md): the Hello ``info`` carries
the model signature (:mod:`wanrt.client.link.signature`); a gateway that already knows the job's model
returns it in the Welcome ``info`` and the client refuses to train a different one (:class:`ModelMismatch`
naming the first differing layer).

Close is phased: flush queued pushes, say Bye, wait briefly for the gateway's Bye, close the transport,
stop the loop, join the thread, all under ``close_timeout_s``.

Reconnect (:mod:`wanrt.client.link.reconnect`): a lost gateway (connection closed or reset, a Bye the
trainer did not ask for) is dialled again with backoff for ``LinkSpec.reconnect.give_up_s``; then every
push it never acknowledged is sent again, oldest first, before what was queued meanwhile, and a parameter
snapshot still owed is asked for again. A restarted gateway answers every re-sent push once and, if the
job moved on while it was down, sends the ``resync`` notice (``ResyncStarted``). The training thread sees
nothing but a longer wait. A refusal (secret, model, protocol) still fails the link at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import Coroutine
from typing import Any, Final, NamedTuple

import numpy as np

from transports import Timeouts, Transport, connect
from transports.connection_io import next_event
from wanrt.client.config import ClientConfig
from wanrt.client.errors import GatewayUnreachable, ModelMismatch, RunRefused
from wanrt.client.link.api import (
    LinkEvent,
    LinkSpec,
    ResyncAbandoned,
    ResyncStarted,
    ServeRequested,
    SnapshotArrived,
    UpdateArrived,
)
from wanrt.client.link.notices import notice_error
from wanrt.client.link.param_resync import SnapshotReceiver
from wanrt.client.link.reconnect import Backoff, Outstanding, UnackedPushes
from wanrt.client.link.result_streams import ResultStreams
from wanrt.client.link.signature import compare_info
from wanrt.client.site.decision import ConfigChange
from wanrt.codec.lowbit import VALUE_CODINGS
from wanrt.codec.negotiation import VALUE_CODING_KEY, check_value_coding
from wanrt.codec.value_casts import in_wire_dtype
from wanrt.errors import (
    AuthError,
    ConfigError,
    LocalProtocolError,
    PeerLost,
    RemoteProtocolError,
    TransportError,
    WanrtError,
    WanrtTimeout,
)
from wanrt.payload import SparsePayload
from wanrt.protocol.connection import Connection
from wanrt.protocol.events import ConnectionClosed
from wanrt.protocol.job_settings import RESTART_FROM_KEY, TRAINER_KEYS, TrainerSettings
from wanrt.protocol.limits import MAX_COUNTER
from wanrt.protocol.messages import (
    Ack,
    Aggregate,
    Bye,
    ConfigUpdate,
    Error,
    ErrorCode,
    Heartbeat,
    Message,
    Notice,
    Push,
    PushPiece,
    Reject,
    ShardDone,
    ShardGrant,
    ShardRequest,
    Telemetry,
    Welcome,
)
from wanrt.protocol.params import ParamAnnounce, ParamChunk, ParamRefuse, ParamRequest
from wanrt.protocol.push_pieces import PushCut, cut_push, push_cut_hint
from wanrt.protocol.streamed_results import AggregateEnd, AggregatePiece

__all__ = ["GatewayLink", "open_gateway_link"]

log = logging.getLogger(__name__)

_STOP: Final = object()
#: the writer joins queued messages into one transport write until it holds this many bytes (a write of
#: several parts is joined into one buffer: a bound keeps a burst of big pushes from being copied at once)
WRITE_BATCH_BYTES: Final = 1 << 20


class _Pushed(NamedTuple):
    """A push as the training side queues it ahead of its frames: the loop thread notes it (unacknowledged,
    awaiting its result) as it moves the frames to the writer (:meth:`GatewayLink._move_outbox`)."""

    iteration: int
    layer: int
    payload: SparsePayload


def _config_change(msg: ConfigUpdate) -> ConfigChange:
    """A ConfigUpdate's settings, read by the shared schema (:mod:`wanrt.protocol.job_settings`): what the
    gateway let through must still never reach a rank as a learning-rate scale of 0, NaN or inf (the
    parameters would stop or blow up), a local-steps count that accumulates without end or divides by zero,
    or a restart order for no rank. Keys a trainer does not act on are left out (the gateway sends only
    trainer settings; an older one may send more). Out of bounds is the peer's fault: RemoteProtocolError."""
    try:
        s = TrainerSettings.from_wire({k: v for k, v in msg.values.items() if k in TRAINER_KEYS})
    except ConfigError as exc:
        raise RemoteProtocolError(
            f"ConfigUpdate {exc.message}", value=repr(exc.fields.get("value"))[:40]
        ) from None
    return ConfigChange.of(msg.effective_iteration, s)


class GatewayLink:
    """See the module docstring. Create with :func:`open_gateway_link`."""

    def __init__(self, spec: LinkSpec) -> None:
        self.spec = spec
        self._cfg: ClientConfig = spec.config
        self._timeouts = Timeouts(
            connect=spec.config.connect_timeout_s, handshake=spec.config.connect_timeout_s
        )
        self._events: queue.Queue[Any] = queue.Queue()
        self._error: BaseException | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="wanrt-link", daemon=True)
        self._pushes: asyncio.Queue[Message] | None = None
        self._shard_grants: queue.Queue[ShardGrant] = queue.Queue(maxsize=1024)
        self._transport: Transport | None = None
        self._conn: Connection | None = None
        self._tasks: list[asyncio.Task[None]] = []
        #: where a trainer process that replaces one the scheduler restarted (KILL_RESTART) takes over: the
        #: first connection's Welcome says (``restart_from``); 0 for a trainer that starts the job
        self.start_iteration = 0
        self._closed = False
        lengths = tuple(int(np.prod(s, dtype=np.int64)) for s in spec.signature.shapes)
        self._lengths = lengths
        self._block_sizes: dict[int, int] = {}  # per layer, as pushed (empty updates after a restart)
        self._join_floor = 0  # a restarted gateway's join: it runs no round before (reconnect)
        # parameter resync (param_resync)
        self._resync = SnapshotReceiver(lengths, spec.state_lengths, peer=spec.url)
        self._push_cut: PushCut | None = None  # the gateway's cut for streamed pushes
        self._unacked = UnackedPushes()  # loop thread only (reconnect)
        self._outstanding = Outstanding()  # loop thread only
        self._streams = ResultStreams(lengths, peer=spec.url)  # loop thread only; cleared on a reconnect
        self._reconnecting: asyncio.Task[None] | None = None
        self.reconnects = 0  # gateways found again after losing one
        self.resent = 0  # pushes sent again after reconnecting
        self.results_streamed = 0  # results put together from pieces the gateway streamed as they were final
        # messages from the training side not yet moved to the writer's queue (see _enqueue)
        self._outbox: list[Message | _Pushed] = []
        self._outbox_lock = threading.Lock()
        self._wake_pending = False

    # -- training-thread API ---------------------------------------------------------------------------

    def _call(self, coro: Coroutine[Any, Any, Any], timeout: float) -> Any:
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout)
        except TimeoutError:
            fut.cancel()
            raise WanrtTimeout(
                f"gateway link to {self.spec.url} did not finish in time", phase="link", seconds=timeout
            ) from None

    def start(self) -> None:
        self._thread.start()
        try:
            self._call(self._open(), self._cfg.connect_timeout_s * 2 + 1.0)
        except BaseException:
            self._shutdown_thread()
            raise

    def push(self, iteration: int, layer: int, payload: SparsePayload) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise LocalProtocolError("push() on a closed gateway link")
        wire = in_wire_dtype(payload, self._cfg.wire_dtype)
        pushes = self._pushes
        assert pushes is not None
        # a dense layer goes in the gateway's cut-through pieces when it offers them (a streamed push: its
        # round starts with the first piece, wanrt.protocol.push_pieces); else as one Push
        hint, job, site = self._push_cut, self.spec.job, self.spec.site
        pieces = None if hint is None else cut_push(job, iteration, layer, site, wire, hint)
        frames = [Push(job, iteration, layer, 0, site, wire)] if pieces is None else pieces
        # noted on the loop thread in the same step that queues its frames (_move_outbox): noted by one
        # call and queued by another, a reconnect between the two re-sent the push from the noted ones and
        # the writer then sent the queued copy too (the gateway got it twice)
        self._enqueue(_Pushed(iteration, layer, wire), *frames)

    def telemetry(self, iteration: int, metrics: dict[str, float]) -> None:
        if self._error is not None or self._closed:
            return  # measurements are best effort; the next push reports the link's error
        self._enqueue(Telemetry(self.spec.site, iteration, metrics))

    def _queue_message(self, msg: Message) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise LocalProtocolError(f"{type(msg).__name__} on a closed gateway link")
        self._enqueue(msg)

    def _enqueue(self, *msgs: Message | _Pushed) -> None:
        """Training side: hand messages to the writer, in order, waking the loop once per batch.

        Why not one ``call_soon_threadsafe`` per message: each is a write to the loop's self-pipe and a
        wake-up of the link thread, and a step pushes every layer (plus telemetry) within a few
        milliseconds; measured on the demo's small model, the wake-ups cost ~0.3 ms per push under load
        (docs/client.md, "Where an iteration's time goes"). Messages queued while a wake-up is pending
        ride along with it. A push's :class:`_Pushed` note rides in the same batch, just before its frames
        (one wake-up per push, not two: the note had its own ``call_soon_threadsafe``).
        """
        with self._outbox_lock:
            self._outbox.extend(msgs)
            if self._wake_pending:
                return
            self._wake_pending = True
        self._loop.call_soon_threadsafe(self._move_outbox)

    def _move_outbox(self) -> None:
        """Loop thread: everything the training side queued goes to the writer's queue, oldest first."""
        pushes = self._pushes
        assert pushes is not None
        with self._outbox_lock:
            msgs, self._outbox = self._outbox, []
            self._wake_pending = False
        for msg in msgs:
            if isinstance(msg, _Pushed):
                self._note_push(msg.iteration, msg.layer, msg.payload)  # before its frames
            else:
                pushes.put_nowait(msg)

    def request_shards(
        self, rank: int, request: int, epoch: int, dataset_len: int, want: int, fresh: bool
    ) -> None:
        """Ask the job's shard service (through the gateway) for data shards; the answer comes from
        :meth:`next_grant`. Queued behind this step's pushes, like every message of this link."""
        self._queue_message(ShardRequest(rank, request, epoch, dataset_len, want, fresh))

    def report_shards(self, rank: int, epoch: int, shards: tuple[int, ...]) -> None:
        """Tell the shard service these shards are DONE; sent after the pushes queued before it."""
        self._queue_message(ShardDone(rank, epoch, shards))

    def send_params(self, frames: list[Message]) -> None:
        """Queue this site's answer to a peer's parameter request (ParamAnnounce, ParamChunk s)."""
        for frame in frames:
            self._queue_message(frame)

    def next_grant(self, timeout: float) -> ShardGrant | None:
        if self._error is not None:
            raise self._error
        try:
            return self._shard_grants.get(timeout=timeout) if timeout > 0 else self._shard_grants.get_nowait()
        except queue.Empty:
            return None

    def get(self, timeout: float) -> LinkEvent | None:
        if self._error is not None:
            raise self._error
        try:
            item = self._events.get(timeout=timeout) if timeout > 0 else self._events.get_nowait()
        except queue.Empty:
            return None
        if item is _STOP:
            self._events.put(_STOP)  # keep waking later callers
            assert self._error is not None
            raise self._error
        return item

    def close(self, timeout: float) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._error is None:
                self._call(self._close(timeout), timeout + 1.0)
            elif self._tasks:  # the link died: stop its tasks and let go of the socket, nothing to flush
                self._call(self._discard(), timeout + 1.0)
        finally:
            self._shutdown_thread()

    def _shutdown_thread(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._loop.close()

    # -- loop-thread side ------------------------------------------------------------------------------

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
            self._events.put(_STOP)

    @property
    def duplicates_dropped(self) -> int:
        """Results a reconnect brought a second time (dropped)."""
        return self._outstanding.duplicates

    def _note_push(self, iteration: int, layer: int, payload: SparsePayload) -> None:
        self._block_sizes[layer] = payload.block_size
        try:
            self._unacked.note(iteration, layer, payload)
        except WanrtError as exc:
            self._fail(exc)
        held = self._outstanding.pushed(iteration, layer)
        if held is not None:  # the restarted gateway delivered this round before the trainer pushed it
            self._events.put(held)
        elif iteration < self._join_floor:
            # a round the restarted gateway will never send (the job finished it without this site): the
            # push still goes, and the gateway folds it into this site's next push of the layer
            self._outstanding.answered(iteration, layer)
            self._answer_empty(iteration, layer)

    def _raise_floor(self, join_at: int) -> None:
        """No result before ``join_at`` will come: answer what waits for one with empty updates."""
        if join_at > self._join_floor:
            self._join_floor = join_at
            for it, layer in self._outstanding.below(join_at):
                self._answer_empty(it, layer)

    def _answer_empty(self, iteration: int, layer: int) -> None:
        shape = (self._lengths[layer], self._block_sizes.get(layer, 1))
        empty = SparsePayload.empty(layer, *shape)
        self._events.put(UpdateArrived(iteration, layer, empty, (self.spec.site,)))

    def _lost(self, exc: BaseException) -> None:
        """The gateway is gone (not: it refused us): reconnect if the policy says so, else fail."""
        policy = self.spec.reconnect
        if self._closed or self._error is not None or not policy.enabled:
            self._fail(exc)
            return
        if self._reconnecting is None or self._reconnecting.done():
            self._reconnecting = asyncio.get_running_loop().create_task(self._reconnect(exc))

    async def _reconnect(self, cause: BaseException) -> None:
        loop = asyncio.get_running_loop()
        me = asyncio.current_task()
        for task in self._tasks:
            if task is not me:
                task.cancel()
        await asyncio.gather(*(t for t in self._tasks if t is not me), return_exceptions=True)
        self._tasks = []
        if self._transport is not None:
            with contextlib.suppress(Exception):
                await self._transport.close()
        log.warning("gateway %s lost (%s): reconnecting", self.spec.url, cause)
        backoff = Backoff(self.spec.reconnect, loop.time())
        while True:
            delay = backoff.delay(loop.time())
            if delay is None:
                self._fail(
                    PeerLost(
                        f"gateway {self.spec.url} lost ({cause}) and not back within "
                        f"{self.spec.reconnect.give_up_s} s",
                        peer=self.spec.url,
                    )
                )
                return
            await asyncio.sleep(delay)
            try:
                welcome = await self._connect(reconnect=True)
                break
            except (TransportError, WanrtTimeout, OSError) as exc:
                log.debug("gateway %s: reconnect failed: %s", self.spec.url, exc)
            except BaseException as exc:  # refused: wrong secret, other model, another run
                self._fail(exc)
                return
        join_at = welcome.info.get("join_at", -1)
        if isinstance(join_at, int) and not isinstance(join_at, bool) and join_at > 0:
            self._raise_floor(join_at)
        self._streams.clear()  # the new session sends every result not acknowledged yet whole
        try:
            self._drop_queued_pushes()  # every queued push is unacknowledged: sent whole below
            for it, layer, payload in self._unacked.pending():  # oldest first, before anything queued
                await self._send(Push(self.spec.job, it, layer, 0, self.spec.site, payload))
                self.resent += 1
            request = self._resync.ask_again()
            if request is not None:
                await self._send(request)
        except (TransportError, WanrtTimeout, OSError) as exc:
            self._reconnecting = None
            self._lost(exc)  # lost again at once: another round of backoff
            return
        self.reconnects += 1
        log.warning("gateway %s back: %d unacknowledged pushes sent again", self.spec.url, len(self._unacked))
        self._start_tasks()

    def _drop_queued_pushes(self) -> None:
        """Pushes (whole or in pieces) still queued from before the loss: their payloads are in
        ``_unacked`` and go whole; the rest of a streamed push, without its first pieces, would not."""
        self._move_outbox()  # the training side's batch not yet moved holds pushes too
        q = self._pushes
        assert q is not None
        keep = []
        while not q.empty():
            msg = q.get_nowait()
            q.task_done()
            # an Ack or a resync request answered the lost connection (the request is asked again below)
            if not isinstance(msg, (Push, PushPiece, Ack, ParamRequest)):
                keep.append(msg)
        for msg in keep:
            q.put_nowait(msg)

    def _start_tasks(self) -> None:
        self._tasks = [
            asyncio.create_task(self._reader()),
            asyncio.create_task(self._writer()),
            asyncio.create_task(self._heartbeat()),
        ]

    async def _open(self) -> None:
        self._pushes = asyncio.Queue()
        welcome = await self._connect()
        start = welcome.info.get(RESTART_FROM_KEY)
        if start is not None:  # the gateway replaces a trainer its scheduler ordered restarted
            if type(start) is not int or not 0 <= start <= MAX_COUNTER:
                raise RemoteProtocolError("Welcome restart_from must be an iteration", value=repr(start)[:40])
            self.start_iteration = start
        self._start_tasks()

    async def _connect(self, *, reconnect: bool = False) -> Welcome:
        """Dial and authenticate (a first connection or a reconnect: the Hello says which, so a restarted
        gateway takes a reconnect of the run it served for what it is)."""
        spec = self.spec
        try:
            transport = await connect(spec.url, timeouts=self._timeouts)
        except (TransportError, WanrtTimeout, OSError) as exc:
            raise GatewayUnreachable(spec.url, str(exc)) from None
        self._transport = transport
        conn = Connection("trainer", spec.site, spec.job, spec.secret, side="client", peer=spec.url)
        self._conn = conn
        try:
            async with asyncio.timeout(self._cfg.connect_timeout_s):
                info = spec.signature.info()
                if spec.run:
                    info["run"] = spec.run
                if spec.resume_at is not None:
                    info["resume_at"] = spec.resume_at
                if reconnect:
                    info["reconnect"] = True
                if self._cfg.wire_dtype in VALUE_CODINGS:
                    info[VALUE_CODING_KEY] = self._cfg.wire_dtype
                await transport.send([conn.hello(info=info)])
                welcome = await self._handshake_reply()
                refused = welcome.info.get("refused")
                if isinstance(refused, str):  # another run is served there (gateways.node.trainer_runs)
                    raise RunRefused(spec.url, refused)
                check_value_coding(self._cfg.wire_dtype, welcome.info, peer=spec.url)
                diff = compare_info(spec.signature, dict(welcome.info))
                self._push_cut = push_cut_hint(welcome.info)
                if diff is not None:
                    other = welcome.info.get("model_site", "another site")
                    mismatch = ModelMismatch(
                        f"this model differs from the job's model (as trained by site {other}): {diff[1]}",
                        layer=diff[0],
                        name=spec.signature.names[diff[0]] if diff[0] < len(spec.signature.names) else None,
                    )
                    # authenticated first, so the gateway can believe what it checks next (this model
                    # differs) and tell the other sites, whose trainers would otherwise wait for us
                    await transport.send(
                        [
                            conn.authenticate(),
                            conn.abort(mismatch, code=int(ErrorCode.PROTOCOL), message=mismatch.message),
                        ]
                    )
                    raise mismatch
                await transport.send([conn.authenticate()])
        except TimeoutError:
            await transport.close()
            raise WanrtTimeout(
                f"handshake with gateway {spec.url} took longer than {self._cfg.connect_timeout_s} s",
                phase="handshake",
                seconds=self._cfg.connect_timeout_s,
            ) from None
        except BaseException:
            await transport.close()
            raise
        return welcome

    async def _next(self) -> Message | ConnectionClosed:
        assert self._conn is not None and self._transport is not None
        return await next_event(self._conn, self._transport)

    async def _handshake_reply(self) -> Welcome:
        url = self.spec.url
        try:
            event = await self._next()
        except AuthError as exc:
            # say so before leaving: the gateway then tells the other sites this site's trainer cannot
            # authenticate (their trainers would otherwise wait for this site without a word)
            with contextlib.suppress(Exception):
                assert self._conn is not None and self._transport is not None
                await self._transport.send([self._conn.abort(exc, code=int(ErrorCode.AUTH))])
            raise AuthError(
                f"gateway {url} does not share this job's secret ({exc.message})",
                peer=url,
                hint="secret_file must hold the same key as the gateway's job secret",
            ) from None
        if isinstance(event, Welcome):
            return event
        if isinstance(event, Reject):
            if event.code == ErrorCode.AUTH:
                raise AuthError(f"gateway {url} refused this trainer: {event.reason}", peer=url)
            raise RemoteProtocolError(f"gateway {url} refused this trainer: {event.reason}", peer=url)
        raise TransportError(f"gateway {url} closed the connection during the handshake", peer=url)

    async def _reader(self) -> None:
        url = self.spec.url
        try:
            while True:
                event = await self._next()
                if isinstance(event, Aggregate):
                    self._streams.drop(event.iteration, event.layer)  # whole: its pieces are not needed
                    self._result(event.iteration, event.layer, event.round, event.payload, event.sites)
                elif isinstance(event, AggregatePiece):
                    self._streams.piece(event)  # checked against the model before anything is allocated
                elif isinstance(event, AggregateEnd):
                    payload = self._streams.end(event)
                    if payload is not None:
                        self.results_streamed += 1
                        self._result(event.iteration, event.layer, event.round, payload, event.sites)
                    elif self._outstanding.expects(event.iteration, event.layer):
                        raise RemoteProtocolError(
                            f"gateway {url} ended a streamed result it sent no piece of", peer=url
                        )
                    else:  # a result this trainer already has (a reconnect's duplicate): acknowledged
                        self._send_soon(Ack(event.iteration, event.layer, event.round))
                elif isinstance(event, ConfigUpdate):
                    self._events.put(_config_change(event))
                elif isinstance(event, Notice):
                    err = notice_error(self.spec, event)
                    if err is not None:
                        raise err
                    request = self._resync.on_notice(event)
                    if request is not None:
                        self._events.put(ResyncStarted(request.iteration))
                        self._raise_floor(request.iteration)  # rounds before it: in the snapshot
                        self._send_soon(request)
                elif isinstance(event, ParamAnnounce):
                    self._resync.on_announce(event)  # checked against this model before any allocation
                elif isinstance(event, ParamChunk):
                    snapshot = self._resync.on_chunk(event)
                    if snapshot is not None:
                        self._events.put(SnapshotArrived(snapshot))
                    elif self._resync.reask:  # failed its checksum: ask again
                        again = self._resync.ask_again()
                        if again is not None:
                            self._send_soon(again)
                elif isinstance(event, ParamRefuse):
                    if self._resync.on_refuse(event):
                        self._events.put(ResyncAbandoned())
                elif isinstance(event, ParamRequest):
                    self._events.put(ServeRequested(event.request, event.iteration, event.state))
                elif isinstance(event, ShardGrant):
                    if self._shard_grants.full():  # answers nobody asked for: the gateway misbehaves
                        raise RemoteProtocolError("too many unread shard grants", peer=url)
                    self._shard_grants.put_nowait(event)
                elif isinstance(event, Ack):
                    self._unacked.ack(event.iteration, event.layer)  # counted: no need to send it again
                elif isinstance(event, Heartbeat):
                    continue
                elif isinstance(event, Bye):
                    if not self._closed:
                        raise PeerLost(
                            f"gateway {url} closed the session: {event.reason or 'no reason'}", peer=url
                        )
                elif isinstance(event, Error):
                    cls = AuthError if event.code == ErrorCode.AUTH else RemoteProtocolError
                    raise cls(f"gateway {url} aborted the connection: {event.message}", peer=url)
                elif isinstance(event, ConnectionClosed):
                    if not self._closed:
                        raise PeerLost(f"gateway {url} closed the connection: {event.reason}", peer=url)
                    return
                else:
                    raise RemoteProtocolError(f"unexpected {type(event).__name__} from the gateway", peer=url)
        except asyncio.CancelledError:
            raise
        except (PeerLost, TransportError, OSError) as exc:  # the gateway is gone, it did not refuse us
            self._lost(exc)
        except WanrtError as exc:
            self._fail(exc)
            with contextlib.suppress(Exception):
                assert self._transport is not None and self._conn is not None
                await self._transport.send([self._conn.abort(exc)])
        except Exception as exc:  # a bug must still wake the training thread, never hang it
            self._fail(exc)

    def _result(
        self, iteration: int, layer: int, round_: int, payload: SparsePayload, sites: tuple[str, ...]
    ) -> None:
        """A round's result (whole or put together from its pieces): to the training thread, acknowledged."""
        update = UpdateArrived(iteration, layer, payload, sites)
        deliver = self._outstanding.result(iteration, layer, update)
        if deliver is not None:
            self._events.put(deliver)
        self._send_soon(Ack(iteration, layer, round_))

    def _send_soon(self, msg: Message) -> None:
        """Reader side: hand a reply (an Ack, a resync request) to the writer instead of writing it here.

        Why: a reader that awaits its own write stops reading while the writer's big push fills the
        socket; a gateway that writes a big result before it reads on (the test fixture
        ``tools/harness/fake_gateway.py`` does) then blocks too, and neither side reads again: a
        deadlock that ``tools/bench_client.py`` hit in one run of three. The reply goes behind the
        pushes already queued, which only delays the gateway's bookkeeping, never a result.
        """
        assert self._pushes is not None
        self._pushes.put_nowait(msg)

    async def _send(self, msg: Message) -> None:
        assert self._conn is not None and self._transport is not None
        await self._transport.send(self._conn.send_parts(msg))

    async def _writer(self) -> None:
        assert self._pushes is not None
        try:
            assert self._conn is not None and self._transport is not None
            while True:
                # every message queued by now goes out in one write (one syscall, one drain) rather than
                # one each: the frames on the wire are the same, in the same order
                first = await self._pushes.get()
                taken = 1
                try:
                    parts = list(self._conn.send_parts(first))
                    size = sum(x.nbytes for x in parts)
                    while size < WRITE_BATCH_BYTES and not self._pushes.empty():
                        more = self._conn.send_parts(self._pushes.get_nowait())
                        taken += 1
                        parts.extend(more)
                        size += sum(x.nbytes for x in more)
                    await self._transport.send(parts)
                finally:
                    for _ in range(taken):
                        self._pushes.task_done()
        except asyncio.CancelledError:
            raise
        except (TransportError, WanrtTimeout, OSError) as exc:  # a push lost here is in _unacked
            self._lost(exc)
        except Exception as exc:
            self._fail(exc)

    async def _heartbeat(self) -> None:
        seq = 0
        loop = asyncio.get_running_loop()
        try:
            while True:
                await asyncio.sleep(self._timeouts.heartbeat_interval)
                seq += 1
                await self._send(Heartbeat(seq, loop.time()))
        except asyncio.CancelledError:
            raise
        except (TransportError, WanrtTimeout, OSError) as exc:
            self._lost(exc)
        except Exception as exc:
            self._fail(exc)

    async def _discard(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._transport is not None:
            with contextlib.suppress(Exception):
                await self._transport.close()

    async def _close(self, timeout: float) -> None:
        assert self._pushes is not None and self._transport is not None and self._conn is not None
        if self._reconnecting is not None and not self._reconnecting.done():
            log.warning(
                "gateway %s: closed while reconnecting; %d pushes unsent", self.spec.url, len(self._unacked)
            )
            self._reconnecting.cancel()
            await asyncio.gather(self._reconnecting, return_exceptions=True)
            await self._discard()
            return
        if len(self._tasks) != 3 or any(t.done() for t in self._tasks):  # lost, and reconnecting failed
            await self._discard()
            return
        reader, writer, beat = self._tasks
        beat.cancel()
        try:
            async with asyncio.timeout(timeout):
                await self._pushes.join()  # phase 1: everything pushed is on the wire
                writer.cancel()
                await self._send(Bye("trainer done"))  # phase 2: half close
                await asyncio.wait([reader])  # phase 3: the gateway's Bye / EOF
        except TimeoutError:
            log.warning("gateway %s: close did not finish within %.1f s", self.spec.url, timeout)
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._transport.close()


def open_gateway_link(spec: LinkSpec) -> GatewayLink:
    """Connect and authenticate; raises GatewayUnreachable, AuthError, ModelMismatch or WanrtTimeout."""
    link = GatewayLink(spec)
    link.start()
    return link
