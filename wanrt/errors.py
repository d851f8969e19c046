"""The one error hierarchy of wanrt.

Every error wanrt raises on purpose derives from :class:`WanrtError`, so a trainer or an operator can catch
"anything wanrt complained about" in one clause, and the daemons can tell a peer's fault (close that
connection, keep serving the others) from their own bug (crash loudly).

Leaf errors carry structured fields (``peer``, ``limit``, ``value``, ``key`` ...) so that logs and metrics
can report them without parsing messages.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AuthError",
    "ConfigError",
    "KernelError",
    "LimitExceeded",
    "LocalProtocolError",
    "MalformedPayload",
    "PeerLost",
    "ProtocolError",
    "RemoteProtocolError",
    "RestartRequested",
    "TransportError",
    "UnsupportedValueCoding",
    "WanrtError",
    "WanrtTimeout",
]


class WanrtError(Exception):
    """Root of every error wanrt raises deliberately."""

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields: dict[str, Any] = dict(fields)
        for name, value in fields.items():
            setattr(self, name, value)

    def __str__(self) -> str:
        extra = ", ".join(f"{k}={v!r}" for k, v in self.fields.items() if v is not None)
        return f"{self.message} ({extra})" if extra else self.message


class ConfigError(WanrtError, ValueError):
    """A configuration file, CLI flag or constructor argument is invalid; ``key`` names the bad setting."""

    def __init__(self, message: str, *, key: str | None = None, value: Any = None, path: str | None = None):
        super().__init__(message, key=key, value=value, path=path)


class ProtocolError(WanrtError):
    """The wire protocol was violated. Use the subclasses to say which side broke the rules."""

    def __init__(self, message: str, *, peer: str | None = None, **fields: Any) -> None:
        super().__init__(message, peer=peer, **fields)


class LocalProtocolError(ProtocolError):
    """*We* tried to do something the protocol forbids (a bug in the caller, not the peer's fault)."""


class RemoteProtocolError(ProtocolError):
    """The *peer* sent something the protocol forbids: close that connection, keep serving the others."""


class LimitExceeded(RemoteProtocolError):
    """A size or count announced by the peer exceeds a named limit; raised before anything is allocated."""

    def __init__(self, message: str, *, name: str, limit: int, value: int, peer: str | None = None) -> None:
        super().__init__(message, peer=peer, name=name, limit=limit, value=value)


class MalformedPayload(RemoteProtocolError):
    """A COO payload lies about itself: indices out of range or unsorted, counts that disagree, ..."""


class UnsupportedValueCoding(ProtocolError):
    """The peer does not decode the value coding this side was configured to send (``wire_dtype`` int8,
    int4, int2: ``wanrt.codec.lowbit``), as its handshake said; ``supported`` lists what it decodes. Raised
    at connect, before any payload is sent in a coding the peer would refuse."""

    def __init__(self, message: str, *, coding: str, supported: tuple[str, ...], peer: str | None = None):
        super().__init__(message, peer=peer, coding=coding, supported=supported)


class AuthError(WanrtError):
    """A handshake failed authentication (wrong job secret, replayed or forged proof)."""

    def __init__(self, message: str, *, peer: str | None = None, **fields: Any) -> None:
        super().__init__(message, peer=peer, **fields)


class TransportError(WanrtError, ConnectionError):
    """Moving bytes failed: connect refused, reset, closed under us. Also a :class:`ConnectionError`."""

    def __init__(self, message: str, *, peer: str | None = None, **fields: Any) -> None:
        super().__init__(message, peer=peer, **fields)


class PeerLost(TransportError):
    """A peer stopped answering (heartbeats missed, connection dropped) and was declared lost."""


class WanrtTimeout(WanrtError, TimeoutError):
    """A phase did not finish within its configured deadline. Also a :class:`TimeoutError`."""

    def __init__(
        self, message: str, *, phase: str | None = None, seconds: float | None = None, **fields: Any
    ):
        super().__init__(message, phase=phase, seconds=seconds, **fields)


class KernelError(WanrtError):
    """A compression or optimizer kernel got input it cannot handle, or a requested path is unavailable."""


class RestartRequested(WanrtError):
    """The scheduler ordered this site's trainer process restarted (AntDT §V-E3 KILL_RESTART of a persistent
    straggler rank). Raised out of ``step()`` on every rank of the site at the order's effective iteration,
    after the context closed cleanly (every push sent, every result received), so the process can exit and
    its launcher start a fresh one: under ``torchrun --max-restarts=N`` the elastic agent restarts the whole
    worker group, and the new processes rejoin the job with its current parameters
    (docs/stragglers.md, "KILL_RESTART"). ``rank`` is the rank the scheduler named, ``iteration`` where."""

    def __init__(self, message: str, *, rank: int, iteration: int, site: str | None = None) -> None:
        super().__init__(message, rank=rank, iteration=iteration, site=site)
