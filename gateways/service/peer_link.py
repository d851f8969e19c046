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
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from gateways.node import CloseLink
from transports import BandwidthTrace, ShapedTransport, Timeouts, Transport, drive_trace
from transports.connection_io import RECV_BYTES
from transports.connection_serving import ConnectionEnd, serve_connection
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
        background: list[Coroutine[Any, Any, None]] = []
        if self._trace is not None and isinstance(self.transport, ShapedTransport):
            # the trace driver does not end the link: a finished trace leaves it at its last rate
            clock = asyncio.get_running_loop().time
            background.append(drive_trace(self.transport, self._trace, clock=clock, start=self._trace_start))
        try:
            end = await serve_connection(
                self.conn,
                self.transport,
                reader=self._read(),
                writer=self._write(),
                name=self.peer,
                grace=self._timeouts.close,
                stop=self._closed,
                background=background,
                describe=_describe,
                settle=self._settle,
                flush_when_clean=True,  # our Bye goes out after what is queued
                on_end=self._ended,
                cancelled_reason="",
            )
        finally:
            self.done.set()
        return end.reason

    def _settle(self, end: ConnectionEnd) -> None:
        """A link the node closed keeps the node's reason and error; a clean end is one where our Bye is
        queued, nothing failed and the link was not dropped."""
        close = self._close
        if close is not None:
            end.reason, end.error, end.dropped = close.reason, close.error, close.abort
        channel = self._daemon.node.channel(self.link_id)
        end.clean = end.error is None and channel is not None and channel.bye_sent and not end.dropped

    def _ended(self, end: ConnectionEnd) -> None:
        if self._close is not None and self._close.abort:
            end.dropped = True  # aborted by the node after the verdict (already dropped)
        self.reason = end.reason
        self._daemon.link_finished(self, self.reason or "link ended")

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
