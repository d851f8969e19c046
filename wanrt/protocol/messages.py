"""The message schemas: frozen dataclasses, validated when built, with their wire form.

A message checks its own fields in ``__post_init__`` and raises :class:`LocalProtocolError` for a bad value,
so a caller cannot even construct what a peer would refuse. :func:`decode_message` runs the very same checks
on a peer's header map and re-raises them as :class:`RemoteProtocolError` / :class:`LimitExceeded`.

Type numbering (one byte in the fixed header; see docs/protocol.md and :mod:`wanrt.protocol.registry`):
0x01-0x0F session control, 0x10-0x1F gradient data, 0x20-0x2F control plane, 0x30-0x3F reserved for core
additions, 0x40-0x7F scheduler messages, 0x80-0xFF extensions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import Any, ClassVar, Final, Self

from wanrt import codec
from wanrt.errors import (
    LimitExceeded,
    LocalProtocolError,
    MalformedPayload,
    ProtocolError,
    RemoteProtocolError,
    WanrtError,
)
from wanrt.payload import SparsePayload, n_blocks
from wanrt.protocol.checks import (
    check_bytes,
    check_count,
    check_float,
    check_name,
    check_names,
    check_scalar_map,
    check_text,
    check_uint,
)
from wanrt.protocol.limits import (
    MAX_BUFFERS_PER_MESSAGE,
    MAX_CONFIG_KEYS,
    MAX_COUNTER,
    MAX_FRAME_BYTES,
    MAX_HANDSHAKE_FRAME_BYTES,
    MAX_INFO_KEYS,
    MAX_LAYER_ID,
    MAX_PAYLOAD_ELEMENTS,
    MAX_RANK,
    MAX_SAMPLES,
    MAX_SHARDS_PER_MESSAGE,
    MAX_SITES,
    MAX_TELEMETRY_KEYS,
    MAX_VERSIONS,
    NONCE_BYTES,
)

__all__ = [
    "NOTICE_KINDS",
    "SHARD_STATUSES",
    "Ack",
    "Aggregate",
    "Auth",
    "Bye",
    "Chunk",
    "ChunkCancel",
    "ConfigUpdate",
    "Error",
    "ErrorCode",
    "Heartbeat",
    "Hello",
    "Message",
    "MsgType",
    "Notice",
    "Push",
    "Reject",
    "Role",
    "ShardDone",
    "ShardGrant",
    "ShardRequest",
    "Telemetry",
    "Welcome",
    "check_payload",
    "decode_message",
    "payload_from_wire",
    "payload_wire_form",
]

#: Length of an HMAC-SHA256 proof.
PROOF_BYTES = 32


class Role(StrEnum):
    """What the endpoint is, as announced in Hello/Welcome (the client/server *side* is a separate axis)."""

    GATEWAY = "gateway"
    TRAINER = "trainer"
    SCHEDULER = "scheduler"
    OBSERVER = "observer"


class MsgType(IntEnum):
    """Core message type codes. Values are part of the wire format: never renumber, only add."""

    HELLO = 0x01
    WELCOME = 0x02
    AUTH = 0x03
    REJECT = 0x04
    BYE = 0x08
    ERROR = 0x09
    HEARTBEAT = 0x0A
    PUSH = 0x10
    AGGREGATE = 0x11
    ACK = 0x12
    CHUNK = 0x13
    CHUNK_CANCEL = 0x14
    PUSH_PIECE = 0x15
    AGGREGATE_PIECE = 0x16  # a result streamed to the trainer (wanrt.protocol.streamed_results)
    AGGREGATE_END = 0x17
    TELEMETRY = 0x20
    CONFIG_UPDATE = 0x21
    SHARD_REQUEST = 0x22
    SHARD_GRANT = 0x23
    SHARD_DONE = 0x24
    NOTICE = 0x25
    PARAM_REQUEST = 0x26  # parameter resync (wanrt.protocol.params)
    PARAM_ANNOUNCE = 0x27
    PARAM_CHUNK = 0x28
    PARAM_REFUSE = 0x29


class ErrorCode(IntEnum):
    """Why a peer gave up (Error / Reject ``code``). Unknown codes from newer peers are accepted as ints."""

    PROTOCOL = 1
    AUTH = 2
    LIMIT = 3
    VERSION = 4
    PAYLOAD = 5
    SHUTDOWN = 6
    INTERNAL = 7


class Message:
    """Base of every message. Subclasses are frozen, slotted dataclasses.

    ``TYPE`` is the wire code, ``STREAM`` says the message may flow in both directions once authenticated
    (everything except the handshake, Bye and Error), ``MAX_BUFFERS`` how many out-of-band buffers it may
    carry (0: a frame of this type with a body is refused as soon as its fixed header arrives).
    """

    __slots__ = ()
    __dataclass_fields__: ClassVar[dict[str, Any]]
    TYPE: ClassVar[int]
    STREAM: ClassVar[bool] = False
    MAX_BUFFERS: ClassVar[int] = 0

    def to_wire(self) -> tuple[dict[str, Any], list[memoryview]]:
        """Header map and out-of-band buffers. Default: every field in the map, no buffers."""
        return {name: getattr(self, name) for name in field_names(type(self))}, []

    @classmethod
    def from_wire(cls, header: dict[str, Any], buffers: Sequence[memoryview], *, peer: str | None) -> Self:
        """Rebuild from a header map; raises LocalProtocolError on bad fields (the caller re-labels it)."""
        _expect_keys(cls, header, field_names(cls))
        return cls(**header)


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def field_names(cls: type[Message]) -> tuple[str, ...]:
    """The wire keys of a message class (its dataclass fields, in order), computed once per class."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


_NAME_SETS: dict[tuple[str, ...], frozenset[str]] = {}


def _expect_keys(cls: type, header: Mapping[str, Any], names: tuple[str, ...]) -> None:
    want = _NAME_SETS.get(names)
    if want is None:
        want = _NAME_SETS[names] = frozenset(names)
    if header.keys() != want:  # one set comparison in C (the names of a message class are distinct)
        missing = sorted(set(names) - header.keys())
        extra = sorted(header.keys() - set(names))
        raise LocalProtocolError(f"{cls.__name__} header fields wrong: missing {missing}, unexpected {extra}")


def _set(obj: object, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)


def _role(value: Any) -> Role:
    try:
        return Role(value)
    except ValueError:
        raise LocalProtocolError("unknown role", value=value if isinstance(value, str) else None) from None


def _versions(value: Any, field_name: str, *, allow_empty: bool = False) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)):
        raise LocalProtocolError(f"{field_name} must be a sequence of versions")
    check_count(len(value), field_name, "MAX_VERSIONS", MAX_VERSIONS)
    out = tuple(check_uint(v, field_name, 255) for v in value)
    if (not out and not allow_empty) or 0 in out or len(set(out)) != len(out):
        raise LocalProtocolError(f"{field_name} must be distinct versions in 1..255", value=out)
    return out


def _max_frame(value: Any) -> int:
    mf = check_uint(value, "max_frame", MAX_FRAME_BYTES)
    if mf < MAX_HANDSHAKE_FRAME_BYTES:
        raise LocalProtocolError("max_frame below the handshake frame size", value=mf)
    return mf


def _info(value: Any) -> dict[str, Any]:
    return check_scalar_map(value, "info", "MAX_INFO_KEYS", MAX_INFO_KEYS, allow_bytes=True)


def _code(value: Any) -> int:
    code = check_uint(value, "code", 0xFFFF)
    try:
        return ErrorCode(code)
    except ValueError:
        return code


# ---------------------------------------------------------------------------------------------- handshake


@dataclass(frozen=True, slots=True)
class Hello(Message):
    """Client -> server, first frame. ``nonce`` is fresh per connection; ``max_frame`` is the largest frame
    the client will accept; ``info`` is a small opaque map (model signature, current iteration ...)."""

    TYPE: ClassVar[int] = MsgType.HELLO
    job: str
    site: str
    role: Role
    versions: tuple[int, ...]
    nonce: bytes
    max_frame: int = MAX_FRAME_BYTES
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_name(self.job, "job")
        check_name(self.site, "site")
        _set(self, "role", _role(self.role))
        _set(self, "versions", _versions(self.versions, "versions"))
        _set(self, "nonce", check_bytes(self.nonce, "nonce", exact=NONCE_BYTES))
        _max_frame(self.max_frame)
        _set(self, "info", _info(self.info))


@dataclass(frozen=True, slots=True)
class Welcome(Message):
    """Server -> client: the chosen ``version`` (highest common), the server's own nonce, and ``proof`` =
    HMAC(secret, server label | transcript) showing the server knows the job secret (see auth.py)."""

    TYPE: ClassVar[int] = MsgType.WELCOME
    job: str
    site: str
    role: Role
    versions: tuple[int, ...]
    version: int
    nonce: bytes
    proof: bytes
    max_frame: int = MAX_FRAME_BYTES
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_name(self.job, "job")
        check_name(self.site, "site")
        _set(self, "role", _role(self.role))
        _set(self, "versions", _versions(self.versions, "versions"))
        if self.version not in self.versions:
            raise LocalProtocolError("chosen version is not among the server's versions", value=self.version)
        _set(self, "nonce", check_bytes(self.nonce, "nonce", exact=NONCE_BYTES))
        _set(self, "proof", check_bytes(self.proof, "proof", exact=PROOF_BYTES))
        _max_frame(self.max_frame)
        _set(self, "info", _info(self.info))


@dataclass(frozen=True, slots=True)
class Auth(Message):
    """Client -> server, last handshake frame: the client's HMAC proof over the same transcript."""

    TYPE: ClassVar[int] = MsgType.AUTH
    proof: bytes

    def __post_init__(self) -> None:
        _set(self, "proof", check_bytes(self.proof, "proof", exact=PROOF_BYTES))


@dataclass(frozen=True, slots=True)
class Reject(Message):
    """Server -> client instead of Welcome (unknown job, no common version ...); ``versions`` lists the
    server's versions so the client can say what to upgrade."""

    TYPE: ClassVar[int] = MsgType.REJECT
    code: int
    reason: str
    versions: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _set(self, "code", _code(self.code))
        check_text(self.reason, "reason")
        _set(self, "versions", _versions(self.versions, "versions", allow_empty=True))


# ------------------------------------------------------------------------------------------- session end


@dataclass(frozen=True, slots=True)
class Bye(Message):
    """ "I will send nothing more" (a half close); the peer may finish what it is sending, then says Bye."""

    TYPE: ClassVar[int] = MsgType.BYE
    reason: str = ""

    def __post_init__(self) -> None:
        check_text(self.reason, "reason")


@dataclass(frozen=True, slots=True)
class Error(Message):
    """Fatal: the sender gives up on the connection (after a protocol or auth error, or on abort)."""

    TYPE: ClassVar[int] = MsgType.ERROR
    code: int
    message: str

    def __post_init__(self) -> None:
        _set(self, "code", _code(self.code))
        check_text(self.message, "message")


# ------------------------------------------------------------------------------------------------ stream


@dataclass(frozen=True, slots=True)
class Heartbeat(Message):
    """Liveness and RTT probe; ``sent_at`` is the sender's clock, passed in (the core never reads clocks)."""

    TYPE: ClassVar[int] = MsgType.HEARTBEAT
    STREAM: ClassVar[bool] = True
    seq: int
    sent_at: float

    def __post_init__(self) -> None:
        check_uint(self.seq, "seq", MAX_COUNTER)
        _set(self, "sent_at", check_float(self.sent_at, "sent_at"))


def _check_update_ids(job: Any, iteration: Any, layer: Any, round_: Any, sender: Any) -> None:
    check_name(job, "job")
    check_uint(iteration, "iteration", MAX_COUNTER)
    check_uint(layer, "layer", MAX_LAYER_ID)
    check_uint(round_, "round", MAX_LAYER_ID)
    check_name(sender, "sender")


def check_result_sites(sites: Any) -> tuple[str, ...]:
    """The sites a result sums (:class:`Aggregate`, ``AggregateEnd``): a bounded, non-empty list of distinct
    names, returned as the interned tuple. The distinctness check is skipped for the tuple the last result
    had (the same sites every round), so a round's many results do not each build a set."""
    global _last_distinct
    if not isinstance(sites, (tuple, list)):
        raise LocalProtocolError("sites must be a sequence of site names")
    check_count(len(sites), "sites", "MAX_SITES", MAX_SITES)
    names = check_names(sites, "site")
    if names is not _last_distinct:
        if not names or len(set(names)) != len(names):
            raise LocalProtocolError("sites must be a non-empty list of distinct names", value=names)
        _last_distinct = names
    return names


def check_piece(payload: Any, layer: int, lo: Any, hi: Any, what: str) -> None:
    """A piece of a layer (:class:`PushPiece`, ``AggregatePiece``): blocks ``[lo, hi)`` of the layer, its
    payload holding no block outside the range."""
    check_payload(payload, layer)
    total = n_blocks(payload.dense_len, payload.block_size) if payload.block_size > 0 else 0
    check_uint(lo, "lo", MAX_PAYLOAD_ELEMENTS)
    check_uint(hi, "hi", MAX_PAYLOAD_ELEMENTS)
    if not lo < hi <= total:
        raise LocalProtocolError(f"{what} range must be lo < hi <= n_blocks", value=(lo, hi))
    idx = payload.indices
    if idx.shape[0] and (int(idx[0]) < lo or int(idx[-1]) >= hi):
        raise LocalProtocolError(f"{what} holds blocks outside its range", value=(lo, hi))


def check_payload(payload: Any, layer: int) -> None:
    # Cheap structural checks only: the O(nnz) invariants are the codec's job on receive, and the
    # compressor's on send (re-validating a 100 MB payload per send would cost more than framing it).
    if not isinstance(payload, SparsePayload):
        raise LocalProtocolError("payload must be a SparsePayload", value=type(payload).__name__)
    if payload.layer != layer:
        raise LocalProtocolError("payload.layer disagrees with the message layer", value=payload.layer)
    check_count(payload.nnz, "payload elements", "MAX_PAYLOAD_ELEMENTS", MAX_PAYLOAD_ELEMENTS)


#: The last payloads encoded, by object: a gateway sends one result to each of its children (and the
#: simulator's inner tree nodes to eight each), and encoding is a pure function of the (immutable) payload.
#: Each entry keeps its payload alive, so an ``id`` is never reused while cached. Small, cleared when full.
_ENCODED_MAX: Final = 16
_encoded: dict[int, tuple[SparsePayload, dict[str, Any], tuple[memoryview, ...]]] = {}


def payload_wire_form(payload: SparsePayload) -> tuple[dict[str, Any], tuple[memoryview, ...]]:
    hit = _encoded.get(id(payload))
    if hit is not None and hit[0] is payload:
        return hit[1], hit[2]
    meta, buffers = codec.encode_payload(payload)
    if len(_encoded) >= _ENCODED_MAX:
        _encoded.clear()
    out = (dict(meta), tuple(buffers))
    _encoded[id(payload)] = (payload, *out)
    return out


#: Small payloads decoded lately, by their exact wire form (meta and buffer bytes): decoding and validating
#: is a pure function of those bytes, so equal bytes may share one decoded payload, made read-only. A
#: daemon rarely sees the same bytes twice; the simulator delivers one result to 1 000 gateways in one
#: process. Only payloads up to _DECODED_MAX_BYTES are keyed (the key copies the bytes); bounded, cleared
#: when full.
_DECODED_MAX: Final = 16
_DECODED_MAX_BYTES: Final = 64 * 1024
_decoded: dict[_WireKey, SparsePayload] = {}

#: Bytes from each end of a buffer that go into a wire key's hash.
_HASHED_ENDS: Final = 64


class _WireKey:
    """A payload's exact wire form as a dict key: equal only if meta and both buffers are equal, but
    hashed over the meta, the buffer lengths and their first and last bytes. Hashing the whole 16 KiB of
    a 1 000-site result at each of its 999 receivers was ~10 µs a time; a match is still checked byte for
    byte (the cache is bounded, so even keys made to collide cost at most that many comparisons)."""

    __slots__ = ("_hash", "index", "meta", "values")

    def __init__(self, meta: tuple[Any, ...], values: bytes, index: bytes) -> None:
        self.meta, self.values, self.index = meta, values, index
        n = _HASHED_ENDS
        self._hash = hash((meta, len(values), values[:n], values[-n:], len(index), index[:n], index[-n:]))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is _WireKey
            and self._hash == other._hash
            and self.meta == other.meta
            and self.index == other.index
            and self.values == other.values
        )


def payload_from_wire(meta: Any, buffers: Sequence[memoryview], peer: str | None) -> SparsePayload:
    if not isinstance(meta, dict):
        raise MalformedPayload("payload meta is not a map", peer=peer)
    key: _WireKey | None = None
    if len(buffers) == 2 and len(buffers[0]) + len(buffers[1]) <= _DECODED_MAX_BYTES:
        try:
            key = _WireKey(tuple(sorted(meta.items())), bytes(buffers[0]), bytes(buffers[1]))
            hit = _decoded.get(key)
        except (TypeError, ValueError):  # unhashable or odd meta: the codec reports what is wrong with it
            key = hit = None
        if hit is not None:
            return hit
    try:
        p = codec.decode_payload(meta, buffers, peer=peer, max_elements=MAX_PAYLOAD_ELEMENTS)
        if key is not None:
            p.indices.flags.writeable = False  # shared by every receiver of the same bytes
            p.values.flags.writeable = False
            if len(_decoded) >= _DECODED_MAX:
                _decoded.clear()
            _decoded[key] = p
        return p
    except ProtocolError:
        raise
    except (WanrtError, ValueError, TypeError, KeyError, IndexError, OverflowError, AttributeError) as exc:
        # The codec must turn hostile input into typed errors; if it ever lets one slip, the connection
        # still fails with a peer-fault error instead of crashing the daemon.
        raise MalformedPayload(
            f"payload rejected by the codec: {type(exc).__name__}: {exc}", peer=peer
        ) from exc


def _with_payload_to_wire(msg: Any) -> tuple[dict[str, Any], list[memoryview]]:
    """Header and buffers of a message whose ``payload`` travels out of band (Push, PushPiece)."""
    meta, buffers = payload_wire_form(msg.payload)
    header = {name: getattr(msg, name) for name in field_names(type(msg)) if name != "payload"}
    header["payload"] = dict(meta)
    return header, list(buffers)


def _with_payload_fields(
    cls: type[Message], header: dict[str, Any], buffers: Sequence[memoryview], peer: str | None
) -> dict[str, Any]:
    """The constructor fields of such a message, its payload decoded and checked by the codec."""
    _expect_keys(cls, header, field_names(cls))
    fields = dict(header)
    fields["payload"] = payload_from_wire(fields["payload"], buffers, peer)
    return fields


@dataclass(frozen=True, slots=True)
class Push(Message):
    """One site's sparse gradient of one layer for one (iteration, round): site leader -> gateway, or
    gateway -> gateway. The payload travels out of band (codec buffers), never inside msgpack."""

    TYPE: ClassVar[int] = MsgType.PUSH
    STREAM: ClassVar[bool] = True
    MAX_BUFFERS: ClassVar[int] = MAX_BUFFERS_PER_MESSAGE
    job: str
    iteration: int
    layer: int
    round: int
    sender: str
    payload: SparsePayload

    def __post_init__(self) -> None:
        _check_update_ids(self.job, self.iteration, self.layer, self.round, self.sender)
        check_payload(self.payload, self.layer)

    def to_wire(self) -> tuple[dict[str, Any], list[memoryview]]:
        return _with_payload_to_wire(self)

    @classmethod
    def from_wire(cls, header: dict[str, Any], buffers: Sequence[memoryview], *, peer: str | None) -> Self:
        return cls(**_with_payload_fields(cls, header, buffers, peer))


@dataclass(frozen=True, slots=True)
class Aggregate(Push):
    """The sum (not the mean) over ``sites`` of their pushes for one layer; ``len(sites)`` is the count."""

    TYPE: ClassVar[int] = MsgType.AGGREGATE
    sites: tuple[str, ...]

    def __post_init__(self) -> None:
        Push.__post_init__(self)
        _set(self, "sites", check_result_sites(self.sites))


@dataclass(frozen=True, slots=True)
class LayerPiece(Message):
    """Blocks ``[lo, hi)`` of one (iteration, layer)'s payload: the fields, checks and wire form that a
    push piece (:class:`PushPiece`) and a result piece (``AggregatePiece``) share. Never sent itself (it has
    no ``TYPE``); its subclasses are siblings, so a result piece is never taken for a push piece."""

    WHAT: ClassVar[str]
    STREAM: ClassVar[bool] = True
    MAX_BUFFERS: ClassVar[int] = MAX_BUFFERS_PER_MESSAGE
    job: str
    iteration: int
    layer: int
    sender: str
    lo: int
    hi: int
    payload: SparsePayload

    def __post_init__(self) -> None:
        _check_update_ids(self.job, self.iteration, self.layer, 0, self.sender)
        check_piece(self.payload, self.layer, self.lo, self.hi, self.WHAT)

    def to_wire(self) -> tuple[dict[str, Any], list[memoryview]]:
        return _with_payload_to_wire(self)

    @classmethod
    def from_wire(cls, header: dict[str, Any], buffers: Sequence[memoryview], *, peer: str | None) -> Self:
        return cls(**_with_payload_fields(cls, header, buffers, peer))


@dataclass(frozen=True, slots=True)
class PushPiece(LayerPiece):
    """Blocks ``[lo, hi)`` of one layer's push: trainer -> gateway, a push sent in pieces (streamed).

    Why: a dense layer's push (10 MB of fp16 for 5 M elements) takes 30-60 ms to cross the trainer
    socket and be decoded; sent whole, the gateway's round cannot start before its last byte. In pieces,
    the gateway forwards the first reduce-scatter slices after the first piece (docs/round_bench.md,
    "Streamed push"). Not a :class:`Push` subclass on purpose: a piece is never a whole push to anything
    that handles pushes. The pieces of one (iteration, layer) have disjoint ranges, may come in any
    order and complete the push once they cover every block; the gateway counts it then, never before.
    ``payload`` holds only blocks of the range (its ``dense_len``/``block_size`` are the layer's)."""

    TYPE: ClassVar[int] = MsgType.PUSH_PIECE
    WHAT: ClassVar[str] = "push piece"


#: The last (immutable) site tuple an :class:`Aggregate` found non-empty and distinct: a gateway of a
#: 1 000-site job hands one result's site list to its trainer, and the simulator's 1 000 gateways the
#: very same tuple each, so the set of 1 000 names is built once per result, not once per delivery.
_last_distinct: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class Ack(Message):
    """Receipt of one layer's Push/Aggregate, so the sender can release it (nothing is silently dropped)."""

    TYPE: ClassVar[int] = MsgType.ACK
    STREAM: ClassVar[bool] = True
    iteration: int
    layer: int
    round: int

    def __post_init__(self) -> None:
        check_uint(self.iteration, "iteration", MAX_COUNTER)
        check_uint(self.layer, "layer", MAX_LAYER_ID)
        check_uint(self.round, "round", MAX_LAYER_ID)


@dataclass(frozen=True, slots=True)
class Chunk(Message):
    """A slice ``[offset, offset+len(data))`` of an encoded frame of ``total`` bytes, identified by
    ``item_id``. Lets an EDF send queue interleave a large Push with urgent small frames; see chunks.py."""

    TYPE: ClassVar[int] = MsgType.CHUNK
    STREAM: ClassVar[bool] = True
    MAX_BUFFERS: ClassVar[int] = 1
    item_id: int
    offset: int
    total: int
    data: bytes | memoryview

    def __post_init__(self) -> None:
        check_uint(self.item_id, "item_id", MAX_COUNTER)
        check_uint(self.total, "total", MAX_FRAME_BYTES)
        check_uint(self.offset, "offset", MAX_FRAME_BYTES)
        if not isinstance(self.data, (bytes, memoryview)):
            raise LocalProtocolError(
                "chunk data must be bytes or a memoryview", value=type(self.data).__name__
            )
        n = memoryview(self.data).nbytes
        if n == 0 or self.total == 0 or self.offset + n > self.total:
            raise LocalProtocolError(
                "chunk must be non-empty and lie inside [0, total)", value=(self.offset, n, self.total)
            )

    def to_wire(self) -> tuple[dict[str, Any], list[memoryview]]:
        return {"item_id": self.item_id, "offset": self.offset, "total": self.total}, [memoryview(self.data)]

    @classmethod
    def from_wire(cls, header: dict[str, Any], buffers: Sequence[memoryview], *, peer: str | None) -> Self:
        _expect_keys(cls, header, ("item_id", "offset", "total"))
        if len(buffers) != 1:
            raise LocalProtocolError("a Chunk carries exactly one buffer", value=len(buffers))
        return cls(data=buffers[0], **header)


@dataclass(frozen=True, slots=True)
class ChunkCancel(Message):
    """The sender gave up on a partially sent chunked item (its round was folded into the next one): the
    receiver drops what it reassembled so far instead of holding it until the connection ends."""

    TYPE: ClassVar[int] = MsgType.CHUNK_CANCEL
    STREAM: ClassVar[bool] = True
    item_id: int

    def __post_init__(self) -> None:
        check_uint(self.item_id, "item_id", MAX_COUNTER)


@dataclass(frozen=True, slots=True)
class Telemetry(Message):
    """Measurements a site reports to the scheduler (throughput, idle %, bandwidth estimates ...)."""

    TYPE: ClassVar[int] = MsgType.TELEMETRY
    STREAM: ClassVar[bool] = True
    site: str
    iteration: int
    metrics: dict[str, float]

    def __post_init__(self) -> None:
        check_name(self.site, "site")
        check_uint(self.iteration, "iteration", MAX_COUNTER)
        metrics = check_scalar_map(
            self.metrics, "metrics", "MAX_TELEMETRY_KEYS", MAX_TELEMETRY_KEYS, numbers_only=True
        )
        _set(self, "metrics", metrics)


@dataclass(frozen=True, slots=True)
class ConfigUpdate(Message):
    """New settings that every receiver applies from ``effective_iteration`` on, so that all sites switch at
    the same iteration (AntDT: global actions at one iteration; StellaTrain §4: rate r and batch sizes)."""

    TYPE: ClassVar[int] = MsgType.CONFIG_UPDATE
    STREAM: ClassVar[bool] = True
    values: dict[str, int | float | str | bool]
    effective_iteration: int

    def __post_init__(self) -> None:
        _set(self, "values", check_scalar_map(self.values, "values", "MAX_CONFIG_KEYS", MAX_CONFIG_KEYS))
        check_uint(self.effective_iteration, "effective_iteration", MAX_COUNTER)


#: What a :class:`Notice` is about: a site's trainer runs another model, a connection failed to
#: authenticate, a gateway was refused for its settings, a site's trainer went away, this site's trainer
#: missed rounds and must fetch the job's parameters (``resync``: ``info["iteration"]`` is the iteration J
#: from which its gateway takes part again; see :mod:`wanrt.protocol.params`).
NOTICE_KINDS: Final = ("model", "auth", "config", "trainer", "resync")


@dataclass(frozen=True, slots=True)
class Notice(Message):
    """Gateway → trainer: something at site ``site`` that this trainer should know of without waiting for a
    timeout (reliability: a site's fatal error reaches every site's trainers with its reason).

    ``fatal``: the job cannot go on as configured (a site trains another model) and the trainer raises;
    otherwise it logs a warning and keeps training. ``info`` may carry a model signature (``kind="model"``)
    so the trainer can name the first differing layer itself."""

    TYPE: ClassVar[int] = MsgType.NOTICE
    STREAM: ClassVar[bool] = True
    site: str
    kind: str
    message: str
    fatal: bool
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_name(self.site, "site")
        if self.kind not in NOTICE_KINDS:
            raise LocalProtocolError("unknown notice kind", value=str(self.kind)[:32])
        check_text(self.message, "message")
        if type(self.fatal) is not bool:
            raise LocalProtocolError("fatal must be true or false")
        _set(
            self,
            "info",
            check_scalar_map(self.info, "info", "MAX_INFO_KEYS", MAX_INFO_KEYS, allow_bytes=True),
        )


# ------------------------------------------------------------------------------------------ data shards

#: ``ShardGrant.status``: ``granted`` (shards listed, of the grant's epoch), ``drained`` (the epoch has no
#: TODO shard left, the rest is in flight: this rank's pass is over), ``wait`` (nothing for this rank now:
#: it holds its share, or asks for the next epoch before this one is done; ask again), ``finished`` (the
#: epoch is DONE everywhere), ``unavailable`` (no scheduler reachable or sharding off: ask again later),
#: ``refused`` (the request contradicts the job, e.g. another dataset size).
SHARD_STATUSES: Final = ("granted", "drained", "wait", "finished", "unavailable", "refused")


def check_shard_request(rank: Any, request: Any, epoch: Any, dataset_len: Any, want: Any, fresh: Any) -> None:
    """The fields a shard request shares on the trainer and the scheduler link."""
    check_uint(rank, "rank", MAX_RANK)
    check_uint(request, "request", MAX_COUNTER)
    check_uint(epoch, "epoch", MAX_COUNTER)
    check_uint(dataset_len, "dataset_len", MAX_SAMPLES)
    if check_uint(want, "want", MAX_SHARDS_PER_MESSAGE) == 0:
        raise LocalProtocolError("want must be at least 1", value=want)
    if type(fresh) is not bool:
        raise LocalProtocolError("fresh must be true or false")


def check_shard_ranges(value: Any) -> tuple[tuple[int, int, int], ...]:
    """``(shard id, first sample, end sample)`` triples, at most MAX_SHARDS_PER_MESSAGE of them."""
    if not isinstance(value, (list, tuple)):
        raise LocalProtocolError("shards must be a list", value=type(value).__name__)
    check_count(len(value), "shards", "MAX_SHARDS_PER_MESSAGE", MAX_SHARDS_PER_MESSAGE)
    out = []
    for item in value:
        if not isinstance(item, (list, tuple)) or len(item) != 3:
            raise LocalProtocolError("a shard is [id, start, stop]", value=str(item)[:64])
        sid = check_uint(item[0], "shard id", MAX_SAMPLES)
        start = check_uint(item[1], "shard start", MAX_SAMPLES)
        stop = check_uint(item[2], "shard stop", MAX_SAMPLES)
        if stop <= start:
            raise LocalProtocolError("a shard must hold at least one sample", value=(start, stop))
        out.append((sid, start, stop))
    return tuple(out)


def check_shard_grant(
    rank: Any, request: Any, epoch: Any, status: Any, shards: Any
) -> tuple[tuple[int, int, int], ...]:
    """The fields a shard grant shares on the scheduler and the trainer link; returns the shards."""
    check_uint(rank, "rank", MAX_RANK)
    check_uint(request, "request", MAX_COUNTER)
    check_uint(epoch, "epoch", MAX_COUNTER)
    if status not in SHARD_STATUSES:
        raise LocalProtocolError("unknown shard grant status", value=str(status)[:32])
    out = check_shard_ranges(shards)
    if (status == "granted") != bool(out):
        raise LocalProtocolError("shards are listed exactly when the status is granted")
    return out


def check_shard_ids(value: Any) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)):
        raise LocalProtocolError("shards must be a list", value=type(value).__name__)
    check_count(len(value), "shards", "MAX_SHARDS_PER_MESSAGE", MAX_SHARDS_PER_MESSAGE)
    ids = tuple(check_uint(x, "shard id", MAX_SAMPLES) for x in value)
    if not ids:
        raise LocalProtocolError("a shard report names at least one shard")
    return ids


@dataclass(frozen=True, slots=True)
class ShardRequest(Message):
    """Trainer → its gateway: lease up to ``want`` data shards of ``epoch`` to this site's rank ``rank``
    (AntDT §IV-C1: workers fetch TODO shards from the Dynamic Data Sharding service). ``fresh``: this rank
    just started and holds nothing, so shards still leased to an earlier incarnation of it go back to TODO.
    ``request`` is echoed in the grant so the trainer can match answers to questions."""

    TYPE: ClassVar[int] = MsgType.SHARD_REQUEST
    STREAM: ClassVar[bool] = True
    rank: int
    request: int
    epoch: int
    dataset_len: int
    want: int
    fresh: bool

    def __post_init__(self) -> None:
        check_shard_request(self.rank, self.request, self.epoch, self.dataset_len, self.want, self.fresh)


@dataclass(frozen=True, slots=True)
class ShardGrant(Message):
    """Gateway → trainer: the answer to request ``request`` of rank ``rank``; see :data:`SHARD_STATUSES`."""

    TYPE: ClassVar[int] = MsgType.SHARD_GRANT
    STREAM: ClassVar[bool] = True
    rank: int
    request: int
    epoch: int
    status: str
    shards: tuple[tuple[int, int, int], ...]

    def __post_init__(self) -> None:
        _set(self, "shards", check_shard_grant(self.rank, self.request, self.epoch, self.status, self.shards))


@dataclass(frozen=True, slots=True)
class ShardDone(Message):
    """Trainer → its gateway: rank ``rank`` pushed the gradients of every sample of these shards of
    ``epoch`` (AntDT: a shard is DONE once its gradients reached the servers)."""

    TYPE: ClassVar[int] = MsgType.SHARD_DONE
    STREAM: ClassVar[bool] = True
    rank: int
    epoch: int
    shards: tuple[int, ...]

    def __post_init__(self) -> None:
        check_uint(self.rank, "rank", MAX_RANK)
        check_uint(self.epoch, "epoch", MAX_COUNTER)
        _set(self, "shards", check_shard_ids(self.shards))


# ----------------------------------------------------------------------------------------------- decoding


def as_remote(exc: LocalProtocolError, peer: str | None) -> RemoteProtocolError:
    """Re-label a validation failure on received data as the peer's fault (a LimitExceeded when a named
    limit was crossed)."""
    f = exc.fields
    if {"name", "limit", "value"} <= f.keys():
        return LimitExceeded(exc.message, name=f["name"], limit=f["limit"], value=f["value"], peer=peer)
    return RemoteProtocolError(exc.message, peer=peer, **{k: v for k, v in f.items() if k != "peer"})


def decode_message(
    cls: type[Message], header: dict[str, Any], buffers: Sequence[memoryview], *, peer: str | None = None
) -> Message:
    """Build ``cls`` from a received header map and buffers; every failure is a RemoteProtocolError."""
    if len(buffers) > cls.MAX_BUFFERS:
        raise RemoteProtocolError(f"{cls.__name__} carries too many buffers", peer=peer, value=len(buffers))
    try:
        return cls.from_wire(header, buffers, peer=peer)
    except LocalProtocolError as exc:
        raise as_remote(exc, peer) from None
    except TypeError as exc:  # e.g. a dataclass field given twice
        raise RemoteProtocolError(f"bad {cls.__name__} fields: {exc}", peer=peer) from None
