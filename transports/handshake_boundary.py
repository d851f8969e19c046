"""One error boundary for every handshake a wanrt service runs (accepting or dialing).

A handshake can end four ways besides success, and every service must treat them alike so that a bad peer
only loses its own connection and the service keeps serving the others:

* **timeout** — not finished within the handshake deadline (``asyncio.timeout`` or a transport's own
  :class:`~wanrt.errors.WanrtTimeout`): nothing to tell the peer;
* **refused** — the peer broke the protocol or failed authentication (:class:`~wanrt.errors.ProtocolError`,
  :class:`~wanrt.errors.AuthError`), or we refused it: the peer is told why in a last Error/Reject frame;
* **transport** — the connection failed or closed under us (:class:`~wanrt.errors.TransportError`);
* **cancelled** — the service is shutting down: the connection is closed and the cancellation goes on.

:func:`handshake_boundary` catches exactly these, hands the typed :class:`HandshakeFailure` to the
service's ``on_failure`` (which logs it and tells whoever must know: a refused link shows in ``/status``,
a trainer that failed authentication is reported to the other sites), then ends the connection with
:func:`~transports.connection_io.abort_and_close`. Anything else (a bug) propagates to the listener's
:class:`~transports.base.ConnectionTracker`, which logs it and closes only that connection.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Literal

from transports.base import Transport
from transports.connection_io import abort_and_close
from wanrt.errors import AuthError, ProtocolError, TransportError, WanrtError
from wanrt.protocol import Connection

__all__ = ["HandshakeFailure", "HandshakeGuard", "handshake_boundary"]


@dataclass(frozen=True)
class HandshakeFailure:
    """How a handshake failed (see the module docstring); ``error`` is the typed error (None for the
    handshake deadline itself)."""

    kind: Literal["timeout", "refused", "transport"]
    error: WanrtError | None = None

    @property
    def auth(self) -> bool:
        """The peer failed authentication (or is not who it must be)."""
        return isinstance(self.error, AuthError)

    def __str__(self) -> str:
        return "handshake not finished in time" if self.error is None else str(self.error)


class HandshakeGuard:
    """What :func:`handshake_boundary` yields: after the block, :attr:`failure` says whether and how the
    handshake failed (None: it succeeded, or the block returned)."""

    failure: HandshakeFailure | None = None

    @property
    def failed(self) -> bool:
        return self.failure is not None


@contextlib.asynccontextmanager
async def handshake_boundary(
    conn: Connection,
    transport: Transport,
    *,
    grace: float,
    on_failure: Callable[[HandshakeFailure], None],
) -> AsyncIterator[HandshakeGuard]:
    """Run a handshake in the ``async with`` block; a failure is reported to ``on_failure`` and the
    connection ended (the peer told why when it was refused), and the block's exception suppressed.
    ``grace`` bounds the last frame. Cancellation closes the connection and propagates."""
    guard = HandshakeGuard()
    try:
        yield guard
    except asyncio.CancelledError:
        await abort_and_close(conn, transport, None, grace=grace)
        raise
    except TimeoutError as exc:  # also WanrtTimeout, a TimeoutError
        guard.failure = HandshakeFailure("timeout", exc if isinstance(exc, WanrtError) else None)
    except (ProtocolError, AuthError) as exc:
        guard.failure = HandshakeFailure("refused", exc)
    except TransportError as exc:
        guard.failure = HandshakeFailure("transport", exc)
    else:
        return
    on_failure(guard.failure)
    told = guard.failure.error if guard.failure.kind == "refused" else None
    await abort_and_close(conn, transport, told, grace=grace)
