"""One live, authenticated connection to a peer gateway: a reader, a paced writer and a heartbeat.

A thin asyncio adapter: every decision is made elsewhere (the round engine decides what to send, the EDF
queue in which order, the rate allocator how fast, :mod:`gateways.wire.round_frames` how a round message
maps to
frames). This file only moves bytes:

* **Writer** (one task, the only one that writes): control frames first (acks, heartbeats, model
  announcements, Bye — all tiny), then the EDF queue's next chunk for this peer, framed as a protocol
  ``Chunk`` (a message that fits one chunk goes as its own frame, without the envelope) and paced by a
  token bucket at the link's target rate. ``transport.send`` returns when the
  bytes are accepted into a bounded buffer, so a slow WAN link backs up into the EDF queue, where urgent
  layers overtake.
* **Reader** (the task that runs :meth:`PeerLink.run`): frames → the Connection (which reassembles chunks
  and enforces every limit) → :class:`~gateways.wire.round_frames.RoundInbox` → the owner (the daemon) →
  ``Ack``. Any protocol violation ends only this link, with a log line saying why.
* **Heartbeat**: a ``Heartbeat`` every ``heartbeat_interval``; a peer silent for ``heartbeat_interval ×
  heartbeat_misses`` (checked at each beat, so within one more interval) is declared lost.

Emulated WAN shaping (tests and demos) wraps the transport in a :class:`~transports.ShapedTransport` before
it gets here; a bandwidth trace then drives the shaper's rate while the pacer keeps the allocator's rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final, Protocol

from gateways.rounds.messages import RoundMsg
from gateways.sending.edf_queue import SendQueue
from gateways.sending.link_times import LinkTimes
from gateways.wire.round_frames import SEQ_MODULUS, AckWindow, JobModel, RoundInbox, RoundTag, encode_round
from transports import BandwidthTrace, ShapedTransport, Timeouts, TokenBucket, Transport, drive_trace
from transports.connection_io import abort_and_close, next_event
from transports.link import DEFAULT_BURST_FLOOR
from wanrt.errors import (
    AuthError,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    TransportError,
    WanrtTimeout,
)
from wanrt.protocol import (
    Ack,
    Aggregate,
    Bye,
    Chunk,
    Connection,
    ConnectionClosed,
    Error,
    Heartbeat,
    Message,
    Push,
)

__all__ = ["LinkCounters", "LinkOwner", "Pacer", "PeerLink"]

log = logging.getLogger(__name__)

#: Bytes the writer hands the transport in one call when the pacer lets them go together: fewer
#: syscalls for many small frames, still far below the transports' write buffer.
WRITE_BATCH_BYTES: Final = 256 * 1024


class LinkOwner(Protocol):
    """What a link reports to (the daemon). Each call may raise a RemoteProtocolError: the link ends."""

    def on_round_message(self, link: PeerLink, tag: RoundTag, msg: RoundMsg) -> None: ...

    def on_ack(self, link: PeerLink, ack: Ack, seq: int) -> None:
        """``ack`` acknowledges every message up to our sequence number ``seq``."""
        ...

    def on_job_model(self, link: PeerLink, info: dict[str, Any]) -> None: ...


@dataclass(slots=True)
class LinkCounters:
    """Byte and message counters of one peer, kept across its reconnects (for /metrics and stats)."""

    bytes_sent: int = 0
    bytes_received: int = 0
    messages_sent: int = 0
    messages_received: int = 0


class Pacer:
    """The token bucket that paces a link's data at its target rate (the allocator's, or the base rate)."""

    def __init__(self, rate_bps: float, now: float) -> None:
        self._bucket = TokenBucket(rate_bps, self._burst(rate_bps), now)

    @staticmethod
    def _burst(rate_bps: float) -> int:
        # the same rule as an emulated link: a bucket smaller than rate x wake-up lateness loses rate
        return max(DEFAULT_BURST_FLOOR, int(rate_bps * 0.02 / 8))

    @property
    def rate_bps(self) -> float:
        return self._bucket.rate_bps

    def set_rate(self, rate_bps: float, now: float) -> None:
        self._bucket.set_rate(rate_bps, now, burst=self._burst(rate_bps))

    def delay(self, nbytes: int, now: float) -> float:
        """Reserve ``nbytes``; seconds to wait before they may leave."""
        return max(0.0, self._bucket.reserve(nbytes, now) - now)


class PeerLink:
    """See the module docstring. Built by the daemon after a successful handshake; :meth:`run` until done."""

    def __init__(
        self,
        peer: str,
        conn: Connection,
        transport: Transport,
        *,
        owner: LinkOwner,
        queue: SendQueue,
        item_ids: Iterator[int],
        pacer: Pacer,
        link_times: LinkTimes,
        counters: LinkCounters,
        timeouts: Timeouts,
        trace: BandwidthTrace | None = None,
        trace_start: float | None = None,
        on_progress: Callable[[], None] | None = None,
    ) -> None:
        self.peer = peer
        self.conn = conn
        self.transport = transport
        self.pacer = pacer
        self.counters = counters
        self._owner = owner
        self._queue = queue
        self._item_ids = item_ids
        self._link_times = link_times
        self._timeouts = timeouts
        self._trace = trace
        self._trace_start = trace_start
        self._on_progress = on_progress
        self._inbox = RoundInbox(peer, conn.job)
        self._acks = AckWindow(peer)
        self._control: deque[list[memoryview]] = deque()
        self._tag_items: dict[int, tuple[int, int]] = {}  # EDF item id of a tag -> (seq, iteration)
        self._merged: set[int] = set()  # items holding a tag and its payload frame (always one chunk)
        self._seq = 0
        self._wake = asyncio.Event()
        self._bye_sent = False
        self._closing = False
        self._ended = asyncio.Event()
        self._last_rx = 0.0
        self.reason = ""
        self.retired = False  # the daemon already accounted for this link's end (replaced, shut down)

    @property
    def up(self) -> bool:
        return not self._ended.is_set() and not self._closing

    # -- what the daemon calls (synchronous: frames are built now, sent by the writer) -----------------

    def send_round(self, msg: RoundMsg) -> None:
        """Frame one round message and queue it by (iteration, layer) for the EDF writer."""
        tag, payload = encode_round(msg, seq=self._seq, job=self.conn.job, site=self.conn.site)
        self._seq += 1
        priority = (msg.iteration, msg.layer)
        tag_parts = self.conn.send_parts(tag)
        tag_item = next(self._item_ids)
        self._tag_items[tag_item] = (self._seq - 1, msg.iteration)
        if payload is None:
            self._queue.push(tag_item, self.peer, priority, tag_parts)
        else:
            parts = self.conn.send_parts(payload)
            if sum(len(p) for p in (*tag_parts, *parts)) < self._queue.coalesce_bytes:
                # small enough that the queue sends the item as one chunk (every part is below the
                # coalescing size): one queue item, written as the two frames back to back. Never for
                # larger ones: a chunked item must be exactly one frame for the receiver to reassemble.
                self._queue.push(tag_item, self.peer, priority, [*tag_parts, *parts])
                self._merged.add(tag_item)
            else:
                self._queue.push(tag_item, self.peer, priority, tag_parts)
                self._queue.push(next(self._item_ids), self.peer, priority, parts)
        self._wake.set()

    def send_control(self, msg: Message) -> None:
        """Queue a small control frame (sent before any queued data)."""
        if self._bye_sent:
            return
        self._control.append(self.conn.send_parts(msg))
        if isinstance(msg, Bye):
            self._bye_sent = True
        self._wake.set()

    def set_rate(self, rate_bps: float) -> None:
        self.pacer.set_rate(rate_bps, asyncio.get_running_loop().time())

    async def close(self, reason: str, *, timeout: float) -> None:
        """Say Bye after what is queued for the writer, let it go out (under ``timeout``), end the link."""
        if self._ended.is_set():
            return
        self._closing = True
        self.send_control(Bye(reason[:200]))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._ended.wait()

    # -- the tasks ----------------------------------------------------------------------------------

    async def run(self) -> str:
        """Serve the link until it ends; returns why (also kept in :attr:`reason`). Closes the transport."""
        loop = asyncio.get_running_loop()
        reader = loop.create_task(self._read(), name=f"read {self.peer}")
        tasks: set[asyncio.Task[str]] = {  # the link ends when any of these does
            reader,
            loop.create_task(self._write(), name=f"write {self.peer}"),
            loop.create_task(self._heartbeat(), name=f"heartbeat {self.peer}"),
        }
        # the trace driver is not one of them: a finished trace leaves the link at its last rate
        aux: list[asyncio.Task[None]] = []
        if self._trace is not None and isinstance(self.transport, ShapedTransport):
            aux.append(
                loop.create_task(
                    drive_trace(self.transport, self._trace, clock=loop.time, start=self._trace_start),
                    name=f"trace {self.peer}",
                )
            )
        error: BaseException | None = None
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finished = reader if reader in done else next(iter(done))  # the reader knows the peer's reason
            error = finished.exception()
            if error is None:
                self.reason = finished.result() or self.reason or "link ended"
            else:
                self.reason = _describe(error)
        finally:
            for task in (*tasks, *aux):
                task.cancel()
            await asyncio.gather(*tasks, *aux, return_exceptions=True)
            self._ended.set()
            if error is None and self._bye_sent:
                with contextlib.suppress(TransportError, OSError):
                    await self.transport.close()  # a clean end: both said (or we said) Bye
            else:  # tell the peer why, if the protocol still lets us
                await abort_and_close(
                    self.conn,
                    self.transport,
                    error if isinstance(error, (ProtocolError, AuthError)) else None,
                    grace=self._timeouts.close,
                )
        return self.reason

    async def _read(self) -> str:
        counters = self.counters
        loop = asyncio.get_running_loop()

        def count(n: int) -> None:
            counters.bytes_received += n
            self._last_rx = loop.time()

        while True:
            event = await next_event(self.conn, self.transport, count=count, before_read=self._ack)
            counters.messages_received += 1
            if isinstance(event, Heartbeat):
                continue
            if isinstance(event, RoundTag):
                msg = self._inbox.on_tag(event)
                if msg is not None:
                    self._deliver(event, msg)
            elif isinstance(event, (Push, Aggregate)):  # Aggregate is a Push subclass; listed for clarity
                tag, msg = self._inbox.on_payload(event)
                self._deliver(tag, msg)
            elif isinstance(event, Ack):
                last = self._seq - 1  # the ack names a message we sent: the newest one congruent to it
                self._owner.on_ack(self, event, last - (last - event.round) % SEQ_MODULUS)
            elif isinstance(event, JobModel):
                self._owner.on_job_model(self, event.info)
            elif isinstance(event, Bye):
                self.send_control(Bye("bye"))
                return f"peer closed the link: {event.reason or 'no reason given'}"
            elif isinstance(event, Error):
                return f"peer aborted the link: {event.message}"
            elif isinstance(event, ConnectionClosed):
                return f"connection closed ({event.reason})"
            else:
                raise RemoteProtocolError(
                    f"{type(event).__name__} is not used between gateways", peer=self.peer
                )

    def _deliver(self, tag: RoundTag, msg: RoundMsg) -> None:
        self._owner.on_round_message(self, tag, msg)
        self._acks.taken(tag)

    def _ack(self) -> None:
        """Before waiting for more bytes: one cumulative Ack for everything taken since the last one."""
        due = self._acks.due()
        if due is not None and not self._bye_sent:
            self.send_control(Ack(*due))

    async def _write(self) -> str:
        loop = asyncio.get_running_loop()
        while True:
            self._wake.clear()
            if self._control:
                parts = [p for frame in self._control for p in frame]
                self._control.clear()
                await self._send(parts)
                if self._bye_sent and not self._control:
                    return self.reason or "closed by this gateway"
                continue
            parts = []
            size = 0
            while size < WRITE_BATCH_BYTES and not self._control:
                chunk = self._queue.next_chunk(self.peer)
                if chunk is None:
                    break
                now = loop.time()
                if chunk.offset == 0:
                    meta = self._tag_items.pop(chunk.item_id, None)
                    if meta is not None:
                        self._link_times.sent(self.peer, meta[0], meta[1], now)
                if chunk.offset == 0 and chunk.last:
                    frame = [chunk.data]  # whole frames fit one chunk: no Chunk envelope needed
                    self._merged.discard(chunk.item_id)
                else:
                    if chunk.item_id in self._merged:
                        raise LocalProtocolError("a two-frame queue item was cut into chunks")
                    frame = self.conn.send_parts(Chunk(chunk.item_id, chunk.offset, chunk.total, chunk.data))
                n = sum(len(p) for p in frame)
                wait = self.pacer.delay(n, now)
                if wait > 0:
                    if parts:
                        await self._send(parts)
                        parts, size = [], 0
                    await asyncio.sleep(wait)  # pacing: the link's target rate, not a race
                parts.extend(frame)
                size += n
            if parts:
                await self._send(parts)
                if self._on_progress is not None:
                    self._on_progress()
                continue
            await self._wake.wait()

    async def _send(self, parts: list[memoryview]) -> None:
        await self.transport.send(parts)
        self.counters.bytes_sent += sum(len(p) for p in parts)
        self.counters.messages_sent += 1

    async def _heartbeat(self) -> str:
        """Send a Heartbeat every interval; end the link when the peer has been silent for ``misses``
        intervals (any bytes count: a busy link needs no heartbeats to look alive)."""
        loop = asyncio.get_running_loop()
        t = self._timeouts
        lost_after = t.heartbeat_interval * t.heartbeat_misses
        self._last_rx = loop.time()
        seq = 0
        while True:
            await asyncio.sleep(t.heartbeat_interval)  # the heartbeat period itself
            silent = loop.time() - self._last_rx
            if silent > lost_after:
                raise WanrtTimeout(
                    f"no heartbeat from {self.transport.peer} for {silent:.1f} s",
                    phase="heartbeat",
                    seconds=lost_after,
                    peer=self.peer,
                )
            seq += 1
            self.send_control(Heartbeat(seq, loop.time()))


def _describe(exc: BaseException) -> str:
    if isinstance(exc, WanrtTimeout) and exc.fields.get("phase") == "heartbeat":
        return f"peer silent: {exc.message}"
    if isinstance(exc, (ProtocolError, AuthError)):
        return f"protocol violation by the peer: {exc}"
    if isinstance(exc, TransportError):
        return f"transport failed: {exc}"
    if isinstance(exc, WanrtTimeout):
        return f"timed out: {exc}"
    return f"internal error: {type(exc).__name__}: {exc}"
