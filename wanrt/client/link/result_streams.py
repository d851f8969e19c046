"""Results streamed by the gateway, put together as their pieces land (sans-IO; the link thread's).

Why. The gateway hands each finished piece of a dense layer's result to the trainer while the round's later
pieces are still on the WAN (:mod:`wanrt.protocol.streamed_results`). Each piece is copied into the
layer's result buffer as it lands, so when the round's :class:`~wanrt.protocol.AggregateEnd` comes the
result is already whole: the 50 MB of a 25 M-element fp16 layer no longer cross the socket and get
decoded after the round's last byte (docs/round_bench.md, "Session 11").

Pieces are provisional: a stream becomes a result only with its end, which must count exactly the pieces
received and cover every block of the layer, else the gateway broke the protocol
(:class:`~wanrt.errors.RemoteProtocolError`). A whole :class:`~wanrt.protocol.Aggregate` for the same
round replaces whatever was put together (:meth:`ResultStreams.drop`), and a reconnect forgets every open
stream (:meth:`ResultStreams.clear`): the gateway then sends whole results.

Bounds, all checked before anything is allocated or copied: a stream's layer must be one of the model's
and its ``dense_len`` the layer's (so a buffer is at most one layer of the model); pieces must agree on the
block size and value dtype, hold every block of their range (the gateway streams dense pieces only), and
not overlap; at most ``max_open`` streams are open at a time (:class:`~wanrt.errors.LimitExceeded`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from wanrt.errors import LimitExceeded, RemoteProtocolError
from wanrt.payload import SparsePayload, n_blocks
from wanrt.protocol import AggregateEnd, AggregatePiece

__all__ = ["MAX_OPEN_STREAMS", "ResultStreams"]

#: Results being put together at a time: one per layer of the rounds in flight. A trainer waits for at
#: most ``staleness + 1`` iterations of every layer; past this many the gateway misbehaves.
MAX_OPEN_STREAMS = 4096

Key = tuple[int, int]


@dataclass(slots=True)
class _Stream:
    block_size: int
    dtype: str
    values: npt.NDArray[Any]
    pieces: int = 0
    covered: int = 0
    ranges: list[tuple[int, int]] = field(default_factory=list)


class ResultStreams:
    """The streamed results of one gateway connection. ``lengths``: the model's layer sizes."""

    def __init__(self, lengths: Sequence[int], *, peer: str, max_open: int = MAX_OPEN_STREAMS) -> None:
        self._lengths = tuple(lengths)
        self._peer = peer
        self._max_open = max_open
        self._open: dict[Key, _Stream] = {}

    def __len__(self) -> int:
        return len(self._open)

    def piece(self, msg: AggregatePiece) -> None:
        """Copy one piece into its result buffer (allocated with the stream's first piece)."""
        p, key = msg.payload, (msg.iteration, msg.layer)
        peer = self._peer
        s = self._open.get(key)
        if s is None:
            if not 0 <= msg.layer < len(self._lengths) or p.dense_len != self._lengths[msg.layer]:
                what = f"streamed result for layer {msg.layer} does not fit the model"
                raise RemoteProtocolError(what, peer=peer, layer=msg.layer)
            if len(self._open) >= self._max_open:
                raise LimitExceeded(
                    "the gateway streams more results at once than this trainer waits for",
                    name="MAX_OPEN_STREAMS",
                    limit=self._max_open,
                    value=len(self._open) + 1,
                )
            size = n_blocks(p.dense_len, p.block_size) * p.block_size
            s = _Stream(p.block_size, p.value_dtype, np.empty(size, dtype=p.values.dtype))
            self._open[key] = s
        elif p.block_size != s.block_size or p.value_dtype != s.dtype:
            what = "pieces of one result disagree on their format"
            raise RemoteProtocolError(what, peer=peer, layer=msg.layer)
        lo, hi = msg.lo, msg.hi
        if p.nnz_blocks != hi - lo:
            raise RemoteProtocolError("a streamed result piece must hold every block of its range", peer=peer)
        if any(a < hi and lo < b for a, b in s.ranges):
            raise RemoteProtocolError("streamed result pieces overlap", peer=peer, value=(lo, hi))
        bs = s.block_size
        s.values[lo * bs : hi * bs] = p.values
        s.ranges.append((lo, hi))
        s.pieces += 1
        s.covered += hi - lo

    def end(self, msg: AggregateEnd) -> SparsePayload | None:
        """The result the pieces make, once its end says they are it; None if no piece of it is here (a
        round this trainer already has the answer to; the caller decides whether that is expected)."""
        s = self._open.pop((msg.iteration, msg.layer), None)
        if s is None:
            return None
        dense_len = self._lengths[msg.layer]
        total = n_blocks(dense_len, s.block_size)
        if s.pieces != msg.pieces or s.covered != total:
            raise RemoteProtocolError(
                f"streamed result of layer {msg.layer} ended with {s.pieces} pieces covering {s.covered} of "
                f"{total} blocks; its end says {msg.pieces} pieces",
                peer=self._peer,
                layer=msg.layer,
            )
        idx = np.arange(total, dtype=np.int64)
        return SparsePayload(msg.layer, dense_len, s.block_size, idx, s.values, s.dtype)

    def drop(self, iteration: int, layer: int) -> None:
        """A whole result for this round came: what its pieces made is not needed."""
        self._open.pop((iteration, layer), None)

    def clear(self) -> None:
        """The connection ended: its streams will never end."""
        self._open.clear()
