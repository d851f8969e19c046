"""Sans-IO wire protocol of wanrt: framing, message schemas, handshake and the connection state machine.

Nothing here does I/O or reads a clock: :class:`Connection` turns bytes into messages and messages into
bytes, so the asyncio daemons, the simulator and the fuzzers all drive the very same object. The frame
format and handshake are documented byte by byte in docs/protocol.md.
"""

from wanrt.protocol.chunks import Reassembler, split_frame
from wanrt.protocol.config import PROTOCOL_VERSION, SUPPORTED_VERSIONS, ProtocolConfig
from wanrt.protocol.connection import Connection
from wanrt.protocol.events import NEED_DATA, ConnectionClosed, Event, NeedData
from wanrt.protocol.messages import (
    Ack,
    Aggregate,
    Auth,
    Bye,
    Chunk,
    ChunkCancel,
    ConfigUpdate,
    Error,
    ErrorCode,
    Heartbeat,
    Hello,
    Message,
    MsgType,
    Notice,
    Push,
    PushPiece,
    Reject,
    Role,
    ShardDone,
    ShardGrant,
    ShardRequest,
    Telemetry,
    Welcome,
)
from wanrt.protocol.params import ParamAnnounce, ParamChunk, ParamRefuse, ParamRequest
from wanrt.protocol.registry import CORE_REGISTRY, SCHEDULER_TYPES, MessageRegistry
from wanrt.protocol.states import Side, State
from wanrt.protocol.streamed_results import AggregateEnd, AggregatePiece

__all__ = [
    "CORE_REGISTRY",
    "NEED_DATA",
    "PROTOCOL_VERSION",
    "SCHEDULER_TYPES",
    "SUPPORTED_VERSIONS",
    "Ack",
    "Aggregate",
    "AggregateEnd",
    "AggregatePiece",
    "Auth",
    "Bye",
    "Chunk",
    "ChunkCancel",
    "ConfigUpdate",
    "Connection",
    "ConnectionClosed",
    "Error",
    "ErrorCode",
    "Event",
    "Heartbeat",
    "Hello",
    "Message",
    "MessageRegistry",
    "MsgType",
    "NeedData",
    "Notice",
    "ParamAnnounce",
    "ParamChunk",
    "ParamRefuse",
    "ParamRequest",
    "ProtocolConfig",
    "Push",
    "PushPiece",
    "Reassembler",
    "Reject",
    "Role",
    "ShardDone",
    "ShardGrant",
    "ShardRequest",
    "Side",
    "State",
    "Telemetry",
    "Welcome",
    "split_frame",
]
