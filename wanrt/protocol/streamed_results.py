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

from dataclasses import dataclass
from typing import ClassVar, Final

from wanrt.errors import LocalProtocolError
from wanrt.protocol.checks import check_uint
from wanrt.protocol.messages import (
    LayerPiece,
    Message,
    MsgType,
    _check_update_ids,
    _set,
    check_result_sites,
)

__all__ = ["MAX_RESULT_PIECES", "AggregateEnd", "AggregatePiece"]

#: Pieces one streamed result may have: a 1 GB layer cut in 1 MiB pieces is 1 000 (as a streamed push).
MAX_RESULT_PIECES: Final = 4096


@dataclass(frozen=True, slots=True)
class AggregatePiece(LayerPiece):
    """Blocks ``[lo, hi)`` of the result of one (iteration, layer), final at the gateway; provisional at
    the trainer until the round's :class:`AggregateEnd`. ``payload`` holds only blocks of the range (its
    ``dense_len``/``block_size`` are the layer's). Not an ``Aggregate`` subclass on purpose: a piece is
    never a result to anything that handles results."""

    TYPE: ClassVar[int] = MsgType.AGGREGATE_PIECE
    WHAT: ClassVar[str] = "result piece"


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
        _check_update_ids(self.job, self.iteration, self.layer, self.round, self.sender)
        check_uint(self.pieces, "pieces", MAX_RESULT_PIECES)
        if self.pieces < 1:
            raise LocalProtocolError("a streamed result has at least one piece", value=self.pieces)
        _set(self, "sites", check_result_sites(self.sites))
