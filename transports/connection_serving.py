"""Serving one live connection: a reader task and a writer task, and how the connection ends.

Every long-lived wanrt connection (a gateway's peer links, its trainer session and scheduler link, the
scheduler's gateway sessions) runs the same life: a reader and a writer run side by side; the first to
finish (or an order to stop) ends the connection; both are cancelled and awaited; the owner hears why;
then the transport is closed — quietly after a clean goodbye, else after a last Error frame telling the
peer why (:func:`~transports.connection_io.abort_and_close`), or not at all when it was already dropped.
:func:`serve_connection` is that life written once, so that every service ends a connection the same way
and no task or transport outlives it, whatever ended it (the peer, our side, a failure, cancellation).

What a connection *means* stays with its owner, through the hooks: ``settle`` may change the verdict once
the first task finished (a link the node closed keeps the node's reason), ``on_end`` is told the verdict
after both tasks are gone and before the transport is closed — also when serving was cancelled — and may
still say how to close (``clean`` once our Bye was sent, ``dropped`` once the connection was aborted).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from transports.base import Transport
from transports.connection_io import abort_and_close
from wanrt.errors import AuthError, ProtocolError, TransportError
from wanrt.protocol import Connection

__all__ = ["ConnectionEnd", "serve_connection"]


@dataclass
class ConnectionEnd:
    """Why a served connection ended and how it is closed.

    ``error`` (a :class:`~wanrt.errors.ProtocolError` or :class:`~wanrt.errors.AuthError`) is told to the
    peer in the last frame; ``clean``: both sides said Bye, the transport is closed without an Error frame;
    ``dropped``: the transport was aborted already (a newer connection replaced it), nothing is sent."""

    reason: str
    error: BaseException | None = None
    clean: bool = False
    dropped: bool = False


async def serve_connection(
    conn: Connection,
    transport: Transport,
    *,
    reader: Coroutine[Any, Any, str],
    writer: Coroutine[Any, Any, str],
    name: str,
    grace: float,
    stop: asyncio.Event | None = None,
    background: Sequence[Coroutine[Any, Any, None]] = (),
    describe: Callable[[BaseException], str] = str,
    settle: Callable[[ConnectionEnd], None] | None = None,
    flush_when_clean: bool = False,
    on_end: Callable[[ConnectionEnd], None] | None = None,
    cancelled_reason: str = "ended",
) -> ConnectionEnd:
    """Run ``reader`` and ``writer`` (each returns why the connection ends) until one finishes or ``stop``
    is set; returns the verdict (see the module docstring).

    The reader's answer is preferred when both finished (it knows the peer's reason); a task that raised
    gives ``describe(error)`` as the reason and the error. ``background`` tasks (a bandwidth trace) run
    along and never end the connection. With ``flush_when_clean`` the writer gets ``grace`` seconds to
    write what is queued (our Bye) after a clean end. ``grace`` also bounds the last Error frame.
    """
    loop = asyncio.get_running_loop()
    read_task = loop.create_task(reader, name=f"read {name}")
    write_task = loop.create_task(writer, name=f"write {name}")
    tasks: list[asyncio.Task[Any]] = [read_task, write_task]
    watched: set[asyncio.Task[Any]] = {read_task, write_task}
    stopper: asyncio.Task[Any] | None = None
    if stop is not None:
        stopper = loop.create_task(stop.wait(), name=f"stop {name}")
        tasks.append(stopper)
        watched.add(stopper)
    tasks += [loop.create_task(c, name=f"{name} background") for c in background]
    end = ConnectionEnd(cancelled_reason)
    try:
        done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        if stopper is None or stopper not in done:
            finished = read_task if read_task in done else write_task
            end.error = finished.exception()
            end.reason = finished.result() if end.error is None else describe(end.error)
        if settle is not None:
            settle(end)
        if flush_when_clean and end.clean and not write_task.done():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await asyncio.wait({write_task})  # our Bye goes out after what is queued
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if on_end is not None:
            on_end(end)
        await _close(conn, transport, end, grace)
    return end


async def _close(conn: Connection, transport: Transport, end: ConnectionEnd, grace: float) -> None:
    if end.dropped:
        return
    if end.clean:
        with contextlib.suppress(TransportError, OSError):
            await transport.close()
        return
    error = end.error if isinstance(end.error, (ProtocolError, AuthError)) else None
    await abort_and_close(conn, transport, error, grace=grace)
