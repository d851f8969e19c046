"""The one interface every byte mover implements, and the connection bookkeeping listeners share.

Gateways and trainer clients are written against :class:`Transport` only (docs/dev/contracts.md
"Transports"), so a test can swap a TCP socket for an in-memory pair or a shaped WAN link without touching
protocol code. The interface is deliberately tiny: framing belongs to the sans-IO protocol, not here.

Semantics every implementation keeps:

* ``send(parts)`` is message-atomic: the parts of one call are never interleaved with another call's
  parts, and it returns once the bytes are accepted into a *bounded* buffer (back-pressure), so a slow peer
  slows the sender instead of growing memory. The caller may reuse its buffers when ``send`` returns.
* ``recv()`` returns ``b""`` at a clean EOF and raises :class:`~wanrt.errors.PeerLost` on a reset.
* ``close()`` is idempotent and graceful (buffered bytes are flushed under the close deadline).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, runtime_checkable

from wanrt.errors import RemoteProtocolError, TransportError, WanrtTimeout

__all__ = ["ConnectionTracker", "Handler", "Listener", "Transport", "Wrap", "as_byte_views"]

log = logging.getLogger(__name__)


@runtime_checkable
class Transport(Protocol):
    """A connected, reliable, ordered byte stream to one peer (see the module docstring for semantics)."""

    peer: str

    async def send(self, parts: Sequence[bytes | memoryview]) -> None: ...

    async def recv(self, max_bytes: int = 1 << 20) -> bytes: ...

    async def close(self) -> None: ...

    @property
    def closed(self) -> bool: ...


Handler = Callable[[Transport], Awaitable[None]]
#: Applied by a listener to every accepted transport before the handler sees it (e.g. shaping).
Wrap = Callable[[Transport], Transport]


def as_byte_views(parts: Sequence[bytes | memoryview]) -> list[memoryview]:
    """Flat unsigned-byte views of ``parts``, so byte counts are ``len()`` even for a float32 view."""
    out = []
    for p in parts:
        mv = memoryview(p)
        if mv.format != "B" or mv.ndim != 1:
            mv = mv.cast("B")
        out.append(mv)
    return out


class ConnectionTracker:
    """Runs one handler task per accepted connection and shuts them down in phases.

    Why a separate object: every listener kind (stream, memory) needs the same guarantees: a handler that
    raises is logged and only *its* connection is closed, never the listener; on shutdown the handlers get
    ``grace`` seconds to finish, then they are cancelled and their transports closed.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._tasks: dict[asyncio.Task[None], Transport] = {}
        self._idle = asyncio.Event()
        self._idle.set()

    def __len__(self) -> int:
        return len(self._tasks)

    async def run(self, transport: Transport, handler: Handler) -> None:
        """Run ``handler(transport)`` in the current task, then close the transport whatever happened."""
        task = asyncio.current_task()
        assert task is not None
        self._tasks[task] = transport
        self._idle.clear()
        try:
            await handler(transport)
        except asyncio.CancelledError:
            raise
        except (TransportError, RemoteProtocolError, WanrtTimeout) as exc:
            log.warning("%s: connection from %s ended: %s", self._name, transport.peer, exc)
        except Exception:
            log.exception("%s: handler failed for %s; closing that connection", self._name, transport.peer)
        finally:
            self._tasks.pop(task, None)
            if not self._tasks:
                self._idle.set()
            await _close_quietly(transport)

    def spawn(self, transport: Transport, handler: Handler) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(self.run(transport, handler))

    async def shutdown(self, grace: float) -> None:
        """Wait up to ``grace`` s for live handlers to return, then cancel the rest and close them."""
        if self._tasks:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await self._idle.wait()
        leftover = list(self._tasks.items())
        for task, _ in leftover:
            task.cancel()
        for task, transport in leftover:
            # return_exceptions: the child's CancelledError is a result; *our* cancellation still raises.
            await asyncio.gather(task, return_exceptions=True)
            await _close_quietly(transport)


async def _close_quietly(transport: Transport) -> None:
    try:
        await transport.close()
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # closing a broken socket must not mask the handler's outcome
        log.debug("closing %s failed: %s", transport.peer, exc)


class Listener:
    """An accepting endpoint: ``close()`` stops accepting, ``wait_closed()`` winds live connections down.

    ``url`` is the address a peer can dial (a ``tcp://…:0`` listener reports its real port) and ``address``
    the raw bound address (``(host, port)``, a socket path, or a memory name).
    """

    def __init__(self, url: str, address: object, tracker: ConnectionTracker, grace: float) -> None:
        self.url = url
        self.address = address
        self._tracker = tracker
        self._grace = grace
        self._accepting = True

    @property
    def accepting(self) -> bool:
        return self._accepting

    @property
    def connections(self) -> int:
        """Number of live handler tasks (for metrics and tests)."""
        return len(self._tracker)

    def close(self) -> None:
        """Stop accepting new connections (idempotent); live ones keep running until ``wait_closed``."""
        if self._accepting:
            self._accepting = False
            self._stop_accepting()

    async def wait_closed(self) -> None:
        """Give live connections the close grace period, then cancel and close them."""
        self.close()
        await self._tracker.shutdown(self._grace)
        await self._after_closed()

    async def aclose(self) -> None:
        self.close()
        await self.wait_closed()

    async def __aenter__(self) -> Listener:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _stop_accepting(self) -> None:
        raise NotImplementedError

    async def _after_closed(self) -> None:
        return None
