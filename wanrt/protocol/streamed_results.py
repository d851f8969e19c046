"""A round's result streamed to the trainer: gateway -> trainer, piece by piece as each is final.

Why. Under the ``allpairs`` topology with cut-through (``allpairs_chunk_bytes``) a dense layer's result is
assembled at the gateway piece by piece: the owner of each segment sends every finished piece as soon as its
N slices are summed (:mod:`gateways.rounds.allpairs`). Sent as one :class:`~wanrt.protocol.Aggregate`, the
trainer gets none of it before the last piece is final: a 25 M-element fp16 layer is 50 MB that then
crosses the trainer socket and is decoded after the round (docs/round_bench.md, "Session 11"). Streamed,
each finished piece goes to the trainer at once (:class:`AggregatePiece`) and is copied into place while
later pieces are still on the WAN; what is left after the round's last byte is one piece, then a small
:class:`AggregateEnd`.

What a piece means. Pieces are *provisional*: a round can still be re-run under a new plan (a site lost)
and end with other sums. A stream becomes the result only with its :class:`AggregateEnd`, which the gateway
sends only when every piece it streamed (``pieces`` of them, covering every block of the layer) is the
result's, to the same trainer session; otherwise it sends the whole :class:`~wanrt.protocol.Aggregate`
and the trainer drops what it put together. A reconnected trainer gets whole results (the gateway keeps
those, never pieces). The trainer acknowledges an :class:`AggregateEnd` as it does an ``Aggregate``.

Bounds (the message's own, before anything is kept): a piece's range and blocks as for
:class:`~wanrt.protocol.PushPiece`; an end's site list as an ``Aggregate``'s and its piece count at most
:data:`MAX_RESULT_PIECES`. The trainer bounds what it allocates by its own model
(:mod:`wanrt.client.link.result_streams`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Self

from wanrt.errors import LocalProtocolError
from wanrt.payload import SparsePayload
from wanrt.protocol.checks import check_count, check_name, check_names, check_uint
from wanrt.protocol.limits import MAX_BUFFERS_PER_MESSAGE, MAX_COUNTER, MAX_LAYER_ID, MAX_SITES
from wanrt.protocol.messages import (
    Message,
    MsgType,
    _check_update_ids,
    _set,
    _with_payload_fields,
    _with_payload_to_wire,
    check_piece,
)

__all__ = ["MAX_RESULT_PIECES", "AggregateEnd", "AggregatePiece"]

#: Pieces one streamed result may have: a 1 GB layer cut in 1 MiB pieces is 1 000 (as a streamed push).
MAX_RESULT_PIECES: Final = 4096


@dataclass(frozen=True, slots=True)
class AggregatePiece(Message):
    """Blocks ``[lo, hi)`` of the result of one (iteration, layer), final at the gateway; provisional at
    the trainer until the round's :class:`AggregateEnd`. ``payload`` holds only blocks of the range (its
    ``dense_len``/``block_size`` are the layer's). Not an ``Aggregate`` subclass on purpose: a piece is
    never a result to anything that handles results."""

    TYPE: ClassVar[int] = MsgType.AGGREGATE_PIECE
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
        check_piece(self.payload, self.layer, self.lo, self.hi, "result piece")

    def to_wire(self) -> tuple[dict[str, Any], list[memoryview]]:
        return _with_payload_to_wire(self)

    @classmethod
    def from_wire(cls, header: dict[str, Any], buffers: Sequence[memoryview], *, peer: str | None) -> Self:
        return cls(**_with_payload_fields(cls, header, buffers, peer))


@dataclass(frozen=True, slots=True)
class AggregateEnd(Message):
    """The result of (iteration, layer) is the ``pieces`` :class:`AggregatePiece` s sent before it on this
    connection; it is the sum over ``sites`` (as :class:`~wanrt.protocol.Aggregate`'s)."""

    TYPE: ClassVar[int] = MsgType.AGGREGATE_END
    STREAM: ClassVar[bool] = True
    job: str
    iteration: int
    layer: int
    round: int
    sender: str
    pieces: int
    sites: tuple[str, ...]

    def __post_init__(self) -> None:
        check_name(self.job, "job")
        check_uint(self.iteration, "iteration", MAX_COUNTER)
        check_uint(self.layer, "layer", MAX_LAYER_ID)
        check_uint(self.round, "round", MAX_LAYER_ID)
        check_name(self.sender, "sender")
        check_uint(self.pieces, "pieces", MAX_RESULT_PIECES)
        if self.pieces < 1:
            raise LocalProtocolError("a streamed result has at least one piece", value=self.pieces)
        if not isinstance(self.sites, (tuple, list)):
            raise LocalProtocolError("sites must be a sequence of site names")
        check_count(len(self.sites), "sites", "MAX_SITES", MAX_SITES)
        sites = check_names(self.sites, "site")
        if not sites or len(set(sites)) != len(sites):
            raise LocalProtocolError("sites must be a non-empty list of distinct names", value=sites)
        _set(self, "sites", sites)
