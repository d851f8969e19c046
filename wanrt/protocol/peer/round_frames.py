"""How a round-engine message (:class:`~wanrt.protocol.peer.round_msg.RoundMsg`) travels between two gateways.

The protocol's ``Push`` / ``Aggregate`` carry a layer's payload, but the round engine needs more than they
hold: the message ``kind`` (partial, extra, segment, segment_final, final, outcome), the ``plan_id`` it was
produced under, the ``step`` and ``segment`` of a ring, and the *contribution ids* ``(site, iteration)`` —
an aggregate for iteration 7 may hold ``("c", 6)``, which ``Aggregate.sites`` (distinct site names) cannot
say. So each RoundMsg becomes:

* a :class:`RoundTag` (extension type 0x80) with everything except the payload, and ``seq``, a per-link
  sequence number; its contribution ids travel as one buffer in the compact form of
  :mod:`wanrt.protocol.peer.contrib_ids` (the header's ``ids`` is their count), encoded once per id set and
  decoded
  once per distinct blob — a 1 000-site result names 1 000 ids, and per-id work at every gateway made a
  round O(N²) (the older form, a header map ``{site: [iteration, ...]}``, is still accepted);
* when the RoundMsg has a payload, right after it on the same link a ``Push`` whose ``round`` field equals
  the tag's ``seq``. ``round`` is otherwise unused between gateways, so it pairs the two frames exactly even
  if the send queue interleaves other items between them. Results travel as a Push too: an ``Aggregate``
  would name every contributing site a second time (its ``sites``), 1 000 names per message in a
  1 000-site job; an Aggregate is still accepted for a final kind when its sites agree with the tag.

The receiver (:class:`RoundInbox`) holds a tag until its payload frame arrives (bounded), checks that the
two agree, and hands the engine one RoundMsg. Acknowledgements are cumulative (:class:`AckWindow`): after
each batch of frames read from the link, one ``Ack(iteration, layer, round=s)`` says "every message up to
sequence number s has been taken" (``iteration``/``layer`` name message s, for logs); the sender uses the
acks to measure per-iteration link times for rate reallocation. One ack per batch instead of one per
message keeps a busy link's acknowledgement traffic to a trickle.

:class:`RoundData` (0x90) is a tag and a payload that fits one chunk in one frame (see its docstring).
:class:`JobModel` (0x81) tells a peer the job's model signature learned after the link came up (otherwise it
travels in the handshake ``info``). These types are registered in :data:`GATEWAY_REGISTRY`, used on
gateway-to-gateway links only. Sans-IO: nothing here touches sockets or clocks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Self

from wanrt.errors import LimitExceeded, LocalProtocolError, RemoteProtocolError
from wanrt.payload import SparsePayload
from wanrt.protocol.checks import check_count, check_names, check_scalar_map, check_uint
from wanrt.protocol.limits import MAX_BUFFERS_PER_MESSAGE, MAX_COUNTER, MAX_INFO_KEYS, MAX_LAYER_ID, MAX_SITES
from wanrt.protocol.messages import (
    Aggregate,
    Message,
    Push,
    check_payload,
    field_names,
    payload_from_wire,
    payload_wire_form,
)
from wanrt.protocol.peer.contrib_ids import (
    MAX_ROUND_IDS,
    ContribIds,
    as_ids,
    decode_ids,
    distinct_sites,
    encode_ids,
)
from wanrt.protocol.peer.probe_train import ProbeRequest, ProbeTrain
from wanrt.protocol.peer.round_msg import MSG_KINDS, ContribId, RoundMsg
from wanrt.protocol.peer.site_fault import SiteFault
from wanrt.protocol.registry import CORE_REGISTRY

__all__ = [
    "FINAL_KINDS",
    "GATEWAY_REGISTRY",
    "MAX_ACK_GAP",
    "MAX_PENDING_TAGS",
    "MAX_ROUND_IDS",
    "SEQ_MODULUS",
    "AckWindow",
    "JobModel",
    "RoundData",
    "RoundInbox",
    "RoundTag",
    "encode_round",
    "encode_round_data",
    "round_data_wire",
]

#: Kinds whose payload is a finished result (the only ones an Aggregate frame may carry).
FINAL_KINDS: Final = frozenset({"final", "segment_final"})

#: Tags are numbered modulo the range of the protocol's ``round`` field (u32); a link never has anywhere
#: near 2**32 messages outstanding, so numbers cannot collide.
SEQ_MODULUS: Final = MAX_LAYER_ID + 1


#: Messages a receiver may hold above its contiguous prefix of sequence numbers. The EDF queue sends urgent
#: messages past queued ones, so gaps are normal, but they are bounded by what the sender has queued; a
#: peer opening more is lying about its sequence numbers.
MAX_ACK_GAP: Final = 1 << 16

#: Tags received whose payload frame has not arrived yet. A sender queues a tag right before its payload,
#: so only tags of payloads interleaved in the send queue are pending at once: a few per chunk slot.
MAX_PENDING_TAGS: Final = 1024


def _check_ids(value: Any) -> ContribIds:
    """The older wire form ``{site: [iteration, ...]}`` (still accepted) as the engine's id set."""
    if not isinstance(value, Mapping):
        raise LocalProtocolError("ids must be a map of site -> iterations", value=type(value).__name__)
    check_count(len(value), "ids sites", "MAX_SITES", MAX_SITES)
    check_names(value.keys(), "ids site")
    total = 0
    for its in value.values():
        if not isinstance(its, (list, tuple)):
            raise LocalProtocolError("ids iterations must be a list", value=type(its).__name__)
        total += len(its)
    check_count(total, "contribution ids", "MAX_ROUND_IDS", MAX_ROUND_IDS)
    out = [(site, it) for site, its in value.items() for it in its]
    for _, it in out:  # inline check_uint: this runs for every round message
        if type(it) is not int or not 0 <= it <= MAX_COUNTER:
            raise LocalProtocolError("ids iteration must be an integer in [0, MAX_COUNTER]", value=it)
    out.sort()
    return ContribIds(out)


def _check_tag(
    seq: Any,
    kind: Any,
    iteration: Any,
    layer: Any,
    plan_id: Any,
    step: Any,
    segment: Any,
    ids: Any,
    payload: Any,
) -> None:
    """A tag's field checks (RoundTag.__post_init__, and round_data_wire, which builds no tag)."""
    check_uint(seq, "seq", MAX_LAYER_ID)
    if kind not in MSG_KINDS:
        raise LocalProtocolError("unknown round message kind", value=str(kind)[:64])
    check_uint(iteration, "iteration", MAX_COUNTER)
    check_uint(layer, "layer", MAX_LAYER_ID)
    check_uint(plan_id, "plan_id", MAX_COUNTER)
    check_uint(step, "step", MAX_COUNTER)
    if type(segment) is not int or not -1 <= segment < MAX_SITES:
        raise LocalProtocolError("segment must be -1 or a ring position", value=segment)
    if type(payload) is not bool:
        raise LocalProtocolError("payload must be true or false", value=type(payload).__name__)
    if not isinstance(ids, tuple):
        raise LocalProtocolError("ids must be a tuple of (site, iteration)")


@dataclass(frozen=True, slots=True)
class RoundTag(Message):
    """Everything of a RoundMsg but its payload; ``payload`` says whether a Push/Aggregate with
    ``round == seq`` follows. ``segment`` is -1 outside a ring."""

    TYPE: ClassVar[int] = 0x80
    STREAM: ClassVar[bool] = True
    MAX_BUFFERS: ClassVar[int] = 1  # the contribution ids
    seq: int
    kind: str
    iteration: int
    layer: int
    plan_id: int
    step: int
    segment: int
    ids: tuple[ContribId, ...]
    payload: bool

    def __post_init__(self) -> None:
        _check_tag(
            self.seq,
            self.kind,
            self.iteration,
            self.layer,
            self.plan_id,
            self.step,
            self.segment,
            self.ids,
            self.payload,
        )

    def to_wire(self) -> tuple[dict[str, Any], list[memoryview]]:
        # the ids travel as one buffer (wanrt.protocol.peer.contrib_ids: "<it>=<site>,...;..."), the header
        # says how
        # many there are; the buffer is encoded once per id set, however many links it goes to
        header = {name: getattr(self, name) for name in field_names(type(self))}
        header["ids"] = len(self.ids)
        return header, [memoryview(encode_ids(self.ids))]

    @classmethod
    def from_wire(cls, header: dict[str, Any], buffers: Sequence[memoryview], *, peer: str | None) -> Self:
        return cls(**_received_tag_fields(header, buffers))

    @property
    def sites(self) -> tuple[str, ...]:
        """Distinct site names of the ids, sorted: what an Aggregate carrying the payload lists."""
        return distinct_sites(self.ids)


#: The header keys of a RoundTag (its fields), and of a RoundData (those and its payload map).
_TAG_KEYS: Final = frozenset(field_names(RoundTag))
_DATA_KEYS: Final = _TAG_KEYS | {"data"}


def _received_tag_fields(header: dict[str, Any], buffers: Sequence[memoryview]) -> dict[str, Any]:
    """A received tag's fields, its ids decoded and bounded (the dataclass checks the rest)."""
    if header.keys() != _TAG_KEYS:  # one set comparison in C
        raise LocalProtocolError("RoundTag header fields wrong", value=sorted(header)[:16])
    fields = dict(header)
    _decode_tag_ids(fields, buffers)
    return fields


def _decode_tag_ids(fields: dict[str, Any], buffers: Sequence[memoryview]) -> None:
    n = fields["ids"]
    if type(n) is int:  # the id set in buffer 0
        check_count(n, "contribution ids", "MAX_ROUND_IDS", MAX_ROUND_IDS)
        if len(buffers) != 1:
            raise LocalProtocolError("RoundTag must carry its ids in exactly one buffer", value=len(buffers))
        ids = decode_ids(buffers[0])
        if len(ids) != n:
            raise LocalProtocolError("RoundTag ids disagree with their count", value=len(ids), limit=n)
        fields["ids"] = ids
    else:  # the older form: a map in the header, no buffer
        if buffers:
            raise LocalProtocolError("RoundTag with map ids carries no buffer", value=len(buffers))
        fields["ids"] = _check_ids(n)


@dataclass(frozen=True, slots=True)
class RoundData(RoundTag):
    """A round message whose payload fits one chunk, in one frame: the tag's fields plus ``data``.

    Why a third form: a tag and its Push are two frames, each framed, checksummed, admitted and decoded on
    its own, and the receiver pairs them again. For the small messages of a many-site job (a 1 000-site
    simulated round is ~2 000 messages of a few KiB) that second frame was a third of all frames handled.
    Larger payloads still travel as tag + Push, cut into chunks the EDF queue can interleave. ``payload``
    is always true; the ids are buffer 0, the payload's codec buffers follow.
    """

    TYPE: ClassVar[int] = 0x90
    MAX_BUFFERS: ClassVar[int] = MAX_BUFFERS_PER_MESSAGE
    data: SparsePayload

    def __post_init__(self) -> None:
        RoundTag.__post_init__(self)
        if self.payload is not True:
            raise LocalProtocolError("RoundData always carries a payload", value=self.payload)
        check_payload(self.data, self.layer)

    def to_wire(self) -> tuple[dict[str, Any], list[memoryview]]:
        return _round_data_wire(
            self.seq,
            self.kind,
            self.iteration,
            self.layer,
            self.plan_id,
            self.step,
            self.segment,
            self.ids,
            self.data,
        )

    @classmethod
    def from_wire(cls, header: dict[str, Any], buffers: Sequence[memoryview], *, peer: str | None) -> Self:
        if "data" not in header or len(buffers) < 1:
            raise LocalProtocolError("RoundData needs its payload map and the ids buffer")
        if header.keys() != _DATA_KEYS:
            raise LocalProtocolError("RoundTag header fields wrong", value=sorted(header)[:16])
        fields = dict(header)
        meta = fields.pop("data")
        _decode_tag_ids(fields, buffers[:1])
        fields["data"] = payload_from_wire(meta, buffers[1:], peer)
        return cls(**fields)

    def round_msg(self) -> RoundMsg:
        return RoundMsg(
            self.kind,  # type: ignore[arg-type]  # checked against MSG_KINDS in __post_init__
            self.iteration,
            self.layer,
            self.plan_id,
            self.data,
            self.ids,
            self.step,
            self.segment,
        )


@dataclass(frozen=True, slots=True)
class JobModel(Message):
    """The job's model signature (keys model, n_layers, group, layers, model_site), learned after the
    link's handshake; a gateway adopts it by the rule of :mod:`gateways.membership.job_model`."""

    TYPE: ClassVar[int] = 0x81
    STREAM: ClassVar[bool] = True
    info: dict[str, Any]

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "info",
            check_scalar_map(self.info, "info", "MAX_INFO_KEYS", MAX_INFO_KEYS, allow_bytes=True),
        )


#: The protocol spoken between gateways: the core messages plus the two above, a site's fault and the
#: timed probe trains (wanrt/protocol/peer/probe_train.py).
GATEWAY_REGISTRY: Final = CORE_REGISTRY.with_messages(
    RoundTag, RoundData, JobModel, SiteFault, ProbeRequest, ProbeTrain
)


def _tag_args(msg: RoundMsg, seq: int) -> dict[str, Any]:
    """A RoundTag's fields for ``msg``, all but ``payload``."""
    return {
        "seq": seq % SEQ_MODULUS,
        "kind": msg.kind,
        "iteration": msg.iteration,
        "layer": msg.layer,
        "plan_id": msg.plan_id,
        "step": msg.step,
        "segment": msg.segment,
        "ids": as_ids(msg.sites),
    }


def encode_round_data(msg: RoundMsg, *, seq: int) -> RoundData:
    """``msg`` (which has a payload) as one :class:`RoundData` frame."""
    assert msg.payload is not None
    return RoundData(**_tag_args(msg, seq), payload=True, data=msg.payload)


def round_data_wire(msg: RoundMsg, *, seq: int) -> tuple[dict[str, Any], list[memoryview]]:
    """``encode_round_data(msg, seq=seq).to_wire()`` without building the RoundData: the same checks and
    the same header and buffers, for the sender's hot path (one per round message per link), where the
    frozen dataclass's field-by-field ``__init__`` was most of the cost. Frame it with
    ``Connection.send_header(RoundData, ...)``."""
    payload = msg.payload
    assert payload is not None
    seq %= SEQ_MODULUS
    ids = as_ids(msg.sites)
    _check_tag(seq, msg.kind, msg.iteration, msg.layer, msg.plan_id, msg.step, msg.segment, ids, True)
    check_payload(payload, msg.layer)
    return _round_data_wire(
        seq, msg.kind, msg.iteration, msg.layer, msg.plan_id, msg.step, msg.segment, ids, payload
    )


def _round_data_wire(
    seq: int,
    kind: str,
    iteration: int,
    layer: int,
    plan_id: int,
    step: int,
    segment: int,
    ids: tuple[ContribId, ...],
    data: SparsePayload,
) -> tuple[dict[str, Any], list[memoryview]]:
    meta, buffers = payload_wire_form(data)
    # the keys in field order (RoundTag's fields, then data), spelled out: this runs per message
    header = {
        "seq": seq,
        "kind": kind,
        "iteration": iteration,
        "layer": layer,
        "plan_id": plan_id,
        "step": step,
        "segment": segment,
        "ids": len(ids),
        "payload": True,
        "data": dict(meta),
    }
    return header, [memoryview(encode_ids(ids)), *buffers]


def encode_round(msg: RoundMsg, *, seq: int, job: str, site: str) -> tuple[RoundTag, Push | None]:
    """The frames that carry ``msg`` (send them in this order on one link)."""
    tag = RoundTag(**_tag_args(msg, seq), payload=msg.payload is not None)
    if msg.payload is None:
        return tag, None
    # every payload travels as a Push: the tag already names the contributions, and an Aggregate would list
    # every contributing site a second time (1 000 names per message in a 1 000-site job)
    return tag, Push(job, msg.iteration, msg.layer, tag.seq, site, msg.payload)


class RoundInbox:
    """Receiver side of one link: pairs tags with their payload frames into RoundMsgs, bounded.

    Every inconsistency is the peer's fault (:class:`RemoteProtocolError` / :class:`LimitExceeded`): the
    daemon closes that link and keeps serving the others.
    """

    def __init__(self, peer: str, job: str, *, max_pending: int = MAX_PENDING_TAGS) -> None:
        self.peer = peer
        self.job = job
        self.max_pending = max_pending
        self._pending: dict[int, RoundTag] = {}

    @property
    def pending(self) -> int:
        return len(self._pending)

    def on_tag(self, tag: RoundTag) -> RoundMsg | None:
        """A tag arrived: the whole RoundMsg if it has no payload, else ``None`` (wait for the payload)."""
        if not tag.payload:
            return self._round_msg(tag, None)
        if tag.seq in self._pending:
            raise RemoteProtocolError("round tag sequence number reused", peer=self.peer, value=tag.seq)
        if len(self._pending) >= self.max_pending:
            raise LimitExceeded(
                "too many round tags waiting for their payload",
                name="MAX_PENDING_TAGS",
                limit=self.max_pending,
                value=len(self._pending) + 1,
                peer=self.peer,
            )
        self._pending[tag.seq] = tag
        return None

    def on_data(self, msg: RoundData) -> RoundMsg:
        """A tag with its payload in one frame: the RoundMsg at once."""
        if msg.seq in self._pending:
            raise RemoteProtocolError("round tag sequence number reused", peer=self.peer, value=msg.seq)
        return msg.round_msg()

    def on_payload(self, msg: Push) -> tuple[RoundTag, RoundMsg]:
        """A Push or Aggregate arrived: its tag and the RoundMsg they make together."""
        tag = self._pending.pop(msg.round, None)
        if tag is None:
            raise RemoteProtocolError(
                f"{type(msg).__name__} without a preceding round tag", peer=self.peer, value=msg.round
            )
        if (msg.iteration, msg.layer) != (tag.iteration, tag.layer):
            raise RemoteProtocolError(
                "payload frame disagrees with its round tag",
                peer=self.peer,
                value=(msg.iteration, msg.layer),
                limit=(tag.iteration, tag.layer),
            )
        if msg.job != self.job or msg.sender != self.peer:
            raise RemoteProtocolError(
                "payload frame names another job or sender", peer=self.peer, value=(msg.job, msg.sender)
            )
        if isinstance(msg, Aggregate) and (tag.kind not in FINAL_KINDS or msg.sites != tag.sites):
            # accepted from gateways that still send results as Aggregate, if it agrees with its tag
            raise RemoteProtocolError(
                "Aggregate.sites disagrees with the tag's contribution ids", peer=self.peer, value=msg.sites
            )
        return tag, self._round_msg(tag, msg)

    def _round_msg(self, tag: RoundTag, msg: Push | None) -> RoundMsg:
        return RoundMsg(
            tag.kind,  # type: ignore[arg-type]  # checked against MSG_KINDS when the tag was built
            tag.iteration,
            tag.layer,
            tag.plan_id,
            None if msg is None else msg.payload,
            tag.ids,
            tag.step,
            tag.segment,
        )


def unwrap(seq_mod: int, base: int) -> int:
    """The full sequence number ``>= base`` that is congruent to ``seq_mod`` modulo :data:`SEQ_MODULUS`."""
    return base + (seq_mod - base) % SEQ_MODULUS


class AckWindow:
    """Receiver side of cumulative acknowledgements on one link (sequence numbers start at 0)."""

    def __init__(self, peer: str, *, max_gap: int = MAX_ACK_GAP) -> None:
        self.peer = peer
        self.max_gap = max_gap
        self._next = 0  # every full sequence number below has been taken
        self._above: dict[int, tuple[int, int]] = {}  # taken beyond the prefix -> (iteration, layer)
        self._acked = -1
        self._last: tuple[int, int] = (0, 0)

    def taken(self, tag: RoundTag) -> None:
        """The message of ``tag`` was handed to the round engine."""
        full = unwrap(tag.seq, self._next)
        if full - self._next >= self.max_gap or full in self._above:
            raise LimitExceeded(
                "round message sequence number out of the window (reused or far ahead)",
                name="MAX_ACK_GAP",
                limit=self.max_gap,
                value=full - self._next,
                peer=self.peer,
            )
        self._above[full] = (tag.iteration, tag.layer)
        while self._next in self._above:
            self._last = self._above.pop(self._next)
            self._next += 1

    def due(self) -> tuple[int, int, int] | None:
        """(iteration, layer, round) of the Ack to send now, or None if nothing new is acknowledged."""
        if self._next - 1 <= self._acked:
            return None
        self._acked = self._next - 1
        return (*self._last, self._acked % SEQ_MODULUS)
