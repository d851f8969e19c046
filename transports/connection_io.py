"""Moving a sans-IO :class:`~wanrt.protocol.Connection` over a :class:`~transports.Transport`: the few awaits
every wanrt connection needs (the gateway's peer and trainer links, and the trainer client's link to its
gateway), kept in one place so that every side reads frames the same way and ends a connection the same
way: one last Error/Reject frame telling the peer why, then the transport closed, never an exception
escaping into the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from transports import Transport
from wanrt.errors import ProtocolError, TransportError, WanrtTimeout
from wanrt.protocol import NEED_DATA, Connection, ConnectionClosed, Message

__all__ = ["RECV_BYTES", "abort_and_close", "next_event"]

log = logging.getLogger(__name__)

#: Bytes asked of the transport per read: large enough that a 256 KiB chunk arrives in a few reads.
RECV_BYTES = 1 << 18


async def next_event(
    conn: Connection,
    transport: Transport,
    *,
    idle: float | None = None,
    count: Callable[[int], None] | None = None,
    before_read: Callable[[], None] | None = None,
) -> Message | ConnectionClosed:
    """The next message (or the end of the stream) from the peer.

    ``idle`` bounds how long the peer may stay silent (heartbeats keep a live peer talking); silence beyond
    it raises :class:`~wanrt.errors.WanrtTimeout` with phase ``"heartbeat"``. ``count`` is told the size of
    every read (byte counters); ``before_read`` is called whenever everything received has been handed
    out and the peer must be waited for (cumulative acknowledgements). Protocol violations raise from
    ``conn`` (the connection is then in ERROR).
    """
    while True:
        event = conn.next_event()
        if event is not NEED_DATA:
            return event
        if before_read is not None:
            before_read()
        if idle is None:
            data = await transport.recv(RECV_BYTES)
        else:
            try:
                async with asyncio.timeout(idle):
                    data = await transport.recv(RECV_BYTES)
            except TimeoutError:
                raise WanrtTimeout(
                    f"no heartbeat from {transport.peer} for {idle:g} s",
                    phase="heartbeat",
                    seconds=idle,
                    peer=transport.peer,
                ) from None
        if count is not None:
            count(len(data))
        conn.receive_data(data)


async def abort_and_close(
    conn: Connection, transport: Transport, error: BaseException | None, *, grace: float
) -> None:
    """Tell the peer why (an Error or Reject frame, if the protocol still allows one), then close.

    The last frame is best effort under ``grace`` seconds: a peer that stopped reading must not keep a
    connection (and the daemon's shutdown) hanging. Cancellation propagates.
    """
    frame = conn.abort(error)
    try:
        if frame and not transport.closed:
            async with asyncio.timeout(grace):
                await transport.send([frame])
    except asyncio.CancelledError:
        raise
    except (TimeoutError, TransportError, OSError, ProtocolError) as exc:
        log.debug("could not tell %s why the connection ends: %s", transport.peer, exc)
    finally:
        with contextlib.suppress(TransportError, OSError):
            await transport.close()
