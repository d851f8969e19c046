"""Which message class a type code stands for, and room for more (scheduler, extensions).

A registry is an immutable value, not a global to mutate at import: the scheduler builds
``CORE_REGISTRY.with_messages(MySchedMsg, ...)`` and passes it to the :class:`Connection` that needs it,
so two components can never fight over a code and importing a module never changes another's protocol.
Extension messages are stream messages (allowed in both directions after authentication); the handshake
and session-end messages are fixed by the core.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Final

from wanrt.errors import LocalProtocolError
from wanrt.protocol.messages import (
    Ack,
    Aggregate,
    Auth,
    Bye,
    Chunk,
    ChunkCancel,
    ConfigUpdate,
    Error,
    Heartbeat,
    Hello,
    Message,
    Notice,
    Push,
    PushPiece,
    Reject,
    ShardDone,
    ShardGrant,
    ShardRequest,
    Telemetry,
    Welcome,
)
from wanrt.protocol.params import PARAM_MESSAGES
from wanrt.protocol.streamed_results import AggregateEnd, AggregatePiece

__all__ = [
    "CORE_MESSAGES",
    "CORE_REGISTRY",
    "EXTENSION_TYPES",
    "SCHEDULER_TYPES",
    "MessageRegistry",
]

#: Codes reserved for scheduler <-> gateway messages (bandwidth estimates, plans, straggler actions ...).
SCHEDULER_TYPES: Final = range(0x40, 0x80)
#: Codes for experiments and third-party extensions.
EXTENSION_TYPES: Final = range(0x80, 0x100)

CORE_MESSAGES: Final[tuple[type[Message], ...]] = (
    Hello,
    Welcome,
    Auth,
    Reject,
    Bye,
    Error,
    Heartbeat,
    Push,
    Aggregate,
    PushPiece,
    AggregatePiece,
    AggregateEnd,
    Ack,
    Chunk,
    ChunkCancel,
    Telemetry,
    ConfigUpdate,
    Notice,
    ShardRequest,
    ShardGrant,
    ShardDone,
    *PARAM_MESSAGES,
)


class MessageRegistry:
    """Immutable map type code -> message class."""

    __slots__ = ("_by_type",)

    def __init__(self, classes: Iterable[type[Message]]) -> None:
        by_type: dict[int, type[Message]] = {}
        for cls in classes:
            code = getattr(cls, "TYPE", None)
            if not isinstance(code, int) or isinstance(code, bool):
                raise LocalProtocolError(f"{cls!r} has no integer TYPE")
            if not 0 < code < 0x100:
                raise LocalProtocolError(f"{cls.__name__}.TYPE must fit one byte", value=code)
            if code in by_type:
                raise LocalProtocolError(
                    f"type code {code:#04x} used by both {by_type[code].__name__} and {cls.__name__}"
                )
            by_type[int(code)] = cls
        self._by_type: Mapping[int, type[Message]] = MappingProxyType(by_type)

    def with_messages(self, *classes: type[Message]) -> MessageRegistry:
        """A new registry with scheduler/extension stream messages added (codes 0x40-0xFF only)."""
        for cls in classes:
            if not issubclass(cls, Message) or not cls.STREAM:
                raise LocalProtocolError(f"{cls!r} must be a Message subclass with STREAM = True")
            if cls.TYPE not in SCHEDULER_TYPES and cls.TYPE not in EXTENSION_TYPES:
                raise LocalProtocolError(
                    f"{cls.__name__}.TYPE must be in the scheduler (0x40-0x7f) or extension (0x80-0xff)"
                    " range",
                    value=cls.TYPE,
                )
        return MessageRegistry((*self._by_type.values(), *classes))

    def get(self, code: int) -> type[Message] | None:
        return self._by_type.get(code)

    def __contains__(self, cls: object) -> bool:
        return isinstance(cls, type) and self._by_type.get(getattr(cls, "TYPE", -1)) is cls

    @property
    def stream_types(self) -> frozenset[int]:
        return frozenset(code for code, cls in self._by_type.items() if cls.STREAM)

    @property
    def types(self) -> Mapping[int, type[Message]]:
        return self._by_type


CORE_REGISTRY: Final = MessageRegistry(CORE_MESSAGES)
