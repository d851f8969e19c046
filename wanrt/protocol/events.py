"""What :meth:`Connection.next_event` returns besides messages: "need more bytes" and "connection over"."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Final, Literal, TypeAlias

from wanrt.protocol.messages import Message

__all__ = ["NEED_DATA", "ConnectionClosed", "Event", "NeedData"]


class NeedData(Enum):
    """Sentinel type: an enum member is a singleton that mypy can narrow on with ``is``."""

    NEED_DATA = "NEED_DATA"

    def __repr__(self) -> str:
        return "NEED_DATA"


#: Returned by ``next_event`` when no complete frame is buffered: feed more bytes with ``receive_data``.
NEED_DATA: Final = NeedData.NEED_DATA


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The byte stream ended. ``clean`` is True when the peer said Bye (or Reject/Error) before EOF, or
    both sides said Bye; an unclean close mid-session means the peer was lost."""

    clean: bool
    reason: str = ""


Event: TypeAlias = Message | ConnectionClosed | Literal[NeedData.NEED_DATA]
