"""What a :class:`~gateways.node.GatewayNode` asks its driver (the daemon, or the simulator) to do.

The node never touches a socket: it queues bytes in its links' channels and says which links have
something to write (:class:`Wake`), which links to end and how (:class:`CloseLink`), and what goes to the
site's trainer (:class:`ToTrainer`, :class:`RefuseTrainer`) and to the scheduler (:class:`ToScheduler`).
Deadlines are not actions: the driver asks
:meth:`GatewayNode.next_deadline` after every call and calls :meth:`GatewayNode.tick` when it is due.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from wanrt.errors import WanrtError
from wanrt.protocol import Message

__all__ = ["CloseLink", "NodeAction", "RefuseTrainer", "ToScheduler", "ToTrainer", "Wake"]


@dataclass(frozen=True, slots=True)
class Wake:
    """Link ``link_id`` has bytes to write: poll it (:meth:`GatewayNode.poll_link`)."""

    link_id: int


@dataclass(frozen=True, slots=True)
class CloseLink:
    """End link ``link_id``. ``error`` set: tell the peer why in a last frame (a protocol violation, a
    silent peer), then close. ``abort``: drop the connection at once (replaced by a newer link, the
    process going away). Neither: our Bye is queued; close once the writer has flushed it."""

    link_id: int
    reason: str
    error: WanrtError | None = None
    abort: bool = False


@dataclass(frozen=True, slots=True)
class ToTrainer:
    """Send ``msg`` (Aggregate, Ack, ConfigUpdate, ShardGrant, Bye) on trainer session ``session``."""

    session: int
    msg: Message


@dataclass(frozen=True, slots=True)
class RefuseTrainer:
    """End trainer session ``session`` with an error frame saying ``reason`` (its model differs from the
    job's, or a newer connection replaced it)."""

    session: int
    reason: str


@dataclass(frozen=True, slots=True)
class ToScheduler:
    """Send ``msg`` (Telemetry, AnnounceReply, shard messages) to the job's scheduler, if connected; dropped
    otherwise (telemetry is periodic and a reply is re-asked by the scheduler)."""

    msg: Message


NodeAction: TypeAlias = Wake | CloseLink | ToTrainer | RefuseTrainer | ToScheduler
