"""One live, authenticated connection to a peer gateway: a reader task, a writer task, nothing decided.

The node (:class:`~gateways.node.GatewayNode`) holds the link's state in a
:class:`~gateways.node.PeerChannel`: what the received bytes mean, what to write next and when (EDF, pacing,
acks, heartbeats), when the link must end. This file moves bytes between that channel and a
:class:`~transports.Transport`:

* **Reader**: ``transport.recv`` → :meth:`GatewayDaemon.link_data` (the node parses and acts).
* **Writer** (the only task that writes): asks :meth:`GatewayNode.poll_link` and writes what it gets;
  sleeps until the pacer's time or until woken by a :class:`~gateways.node.Wake`. ``transport.send``
  returns when the bytes are in a bounded buffer, so a slow WAN link backs up into the EDF queue, where
  urgent layers overtake.
* **Closing** as the node's :class:`~gateways.node.CloseLink` says: after our Bye is written (clean), with
  a last Error frame (a protocol violation, a silent peer), or at once (replaced by a newer link).

Emulated WAN shaping (tests and demos) wraps the transport in a :class:`~transports.ShapedTransport` before
it gets here; a bandwidth trace then drives the shaper's rate while the node's pacer keeps the allocator's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from gateways.node import CloseLink
from transports import BandwidthTrace, ShapedTransport, Timeouts, Transport, drive_trace
from transports.connection_io import RECV_BYTES, abort_and_close
from wanrt.errors import AuthError, ProtocolError, TransportError, WanrtTimeout
from wanrt.protocol import Connection

if TYPE_CHECKING:
    from gateways.service.daemon import GatewayDaemon

__all__ = ["PeerLink", "abort_transport"]

log = logging.getLogger(__name__)


class PeerLink:
    """See the module docstring. Built by the daemon once the node accepted the link; :meth:`run`."""

    def __init__(
        self,
        daemon: GatewayDaemon,
        link_id: int,
        peer: str,
        conn: Connection,
        transport: Transport,
        *,
        timeouts: Timeouts,
        trace: BandwidthTrace | None = None,
        trace_start: float | None = None,
    ) -> None:
        self.link_id = link_id
        self.peer = peer
        self.conn = conn
        self.transport = transport
        self._daemon = daemon
        self._timeouts = timeouts
        self._trace = trace
        self._trace_start = trace_start
        self._wake = asyncio.Event()
        self._close: CloseLink | None = None
        self._closed = asyncio.Event()
        self.done = asyncio.Event()  # run() has finished
        self.reason = ""

    def wake(self) -> None:
        self._wake.set()

    def close_as(self, action: CloseLink) -> None:
        """The node ended this link (see :class:`~gateways.node.CloseLink` for the three ways)."""
        if self._close is None:
            self._close = action
            if action.abort:
                abort_transport(self.transport)
            self._closed.set()
            self._wake.set()

    async def run(self) -> str:
        """Serve the link until it ends; returns why (also kept in :attr:`reason`). Closes the transport."""
        loop = asyncio.get_running_loop()
        reader = loop.create_task(self._read(), name=f"read {self.peer}")
        writer = loop.create_task(self._write(), name=f"write {self.peer}")
        closer = loop.create_task(self._closed.wait(), name=f"close {self.peer}")
        # the trace driver does not end the link: a finished trace leaves it at its last rate
        aux: list[asyncio.Task[None]] = []
        if self._trace is not None and isinstance(self.transport, ShapedTransport):
            aux.append(
                loop.create_task(
                    drive_trace(self.transport, self._trace, clock=loop.time, start=self._trace_start),
                    name=f"trace {self.peer}",
                )
            )
        error: BaseException | None = None
        clean = False
        try:
            done, _ = await asyncio.wait({reader, writer, closer}, return_when=asyncio.FIRST_COMPLETED)
            if self._close is None and closer not in done:
                finished = reader if reader in done else writer  # the reader knows the peer's reason
                error = finished.exception()
                self.reason = finished.result() if error is None else _describe(error)
            if self._close is not None:
                self.reason = self._close.reason
                error = self._close.error
            channel = self._daemon.node.channel(self.link_id)
            clean = (
                error is None
                and channel is not None
                and channel.bye_sent
                and not (self._close is not None and self._close.abort)
            )
            if clean and not writer.done():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._timeouts.close):
                        await asyncio.wait({writer})  # our Bye goes out after what is queued
        finally:
            for task in (reader, writer, closer, *aux):
                task.cancel()
            await asyncio.gather(reader, writer, closer, *aux, return_exceptions=True)
            self._daemon.link_finished(self, self.reason or "link ended")
            if self._close is not None and self._close.abort:
                pass  # already dropped
            elif clean:
                with contextlib.suppress(TransportError, OSError):
                    await self.transport.close()  # a clean end: both said (or we said) Bye
            else:  # tell the peer why, if the protocol still lets us
                await abort_and_close(
                    self.conn,
                    self.transport,
                    error if isinstance(error, (ProtocolError, AuthError)) else None,
                    grace=self._timeouts.close,
                )
            self.done.set()
        return self.reason

    async def _read(self) -> str:
        expect = getattr(self.transport, "expect", None)
        while True:
            data = await self.transport.recv(RECV_BYTES)
            self._daemon.link_data(self.link_id, data)
            if not data:
                return "connection closed (end of stream)"
            if expect is not None:  # wake for the rest of a large frame at once, not per few KB
                expect(self.conn.frame_bytes_missing)

    async def _write(self) -> str:
        loop = asyncio.get_running_loop()
        node = self._daemon.node
        while True:
            self._wake.clear()
            out = node.poll_link(self.link_id, loop.time())
            if out.parts:
                await self.transport.send(out.parts)
                self._daemon.progressed()
                continue
            if out.done:
                return self.reason or "closed by this gateway"
            if out.wait_until is None:
                await self._wake.wait()
                continue
            delay = out.wait_until - loop.time()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):  # pacing: the link's target rate, not a race
                        await self._wake.wait()


def abort_transport(transport: Transport) -> None:
    """Drop a connection at once (TCP: reset); transports without ``abort`` are closed in the background."""
    abort = getattr(transport, "abort", None)
    if callable(abort):
        abort()


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
