"""Deadlines for every phase of a connection, so no await on the network can hang a daemon forever.

Loaded from the ``[transport.timeouts]`` TOML table via :func:`wanrt.config.from_mapping`. A phase that
overruns raises :class:`~wanrt.errors.WanrtTimeout` with ``phase`` set to the field name, so logs say
which phase stalled.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

from wanrt.config import check
from wanrt.errors import WanrtTimeout

__all__ = ["DEFAULT_TIMEOUTS", "Timeouts", "deadline"]

T = TypeVar("T")


@dataclass(frozen=True)
class Timeouts:
    """Per-phase deadlines in seconds.

    ``recv_idle`` is ``None`` (no limit) by default because the transport cannot tell an idle trainer from
    a dead one; the protocol layer sends heartbeats every ``heartbeat_interval`` and declares a peer lost
    after ``heartbeat_misses`` silent intervals (:attr:`peer_lost_after`), and may set ``recv_idle`` to that.
    ``send`` bounds how long one ``send`` may wait for a peer that stopped reading; after it the connection
    is aborted, since a half-written message cannot be resumed.
    """

    connect: float = 10.0
    handshake: float = 10.0
    send: float = 60.0
    recv_idle: float | None = None
    close: float = 5.0
    heartbeat_interval: float = 5.0
    heartbeat_misses: int = 3

    def __post_init__(self) -> None:
        for name in ("connect", "handshake", "send", "close", "heartbeat_interval"):
            value = getattr(self, name)
            check(value > 0, name, value, "must be a positive number of seconds")
        check(
            self.recv_idle is None or self.recv_idle > 0,
            "recv_idle",
            self.recv_idle,
            "must be positive (omit it for no limit)",
        )
        check(self.heartbeat_misses >= 1, "heartbeat_misses", self.heartbeat_misses, "must be >= 1")

    @property
    def peer_lost_after(self) -> float:
        """Silence after which the protocol layer should declare the peer lost."""
        return self.heartbeat_interval * self.heartbeat_misses


#: Shared default (frozen, so one instance serves every call site).
DEFAULT_TIMEOUTS = Timeouts()


async def deadline(aw: Awaitable[T], seconds: float | None, phase: str, peer: str | None) -> T:
    """Await ``aw`` under a deadline; an expiry becomes ``WanrtTimeout(phase=...)``.

    Uses :func:`asyncio.timeout` (no extra task per call, unlike ``wait_for``) and checks ``expired()`` so a
    ``TimeoutError`` raised *inside* ``aw`` is not mistaken for ours. Outside cancellation propagates.
    """
    import asyncio  # here, not at the top: the sans-IO gateway node imports Timeouts

    if seconds is None:
        return await aw
    cm = asyncio.timeout(seconds)
    try:
        async with cm:
            return await aw
    except TimeoutError:
        if cm.expired():
            raise WanrtTimeout(
                f"{phase} with {peer} timed out after {seconds:g} s", phase=phase, seconds=seconds, peer=peer
            ) from None
        raise
