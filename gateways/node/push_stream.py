"""Reassembly of the trainer's streamed pushes (:class:`~wanrt.protocol.PushPiece`), sans-IO.

Why here and not in the round engine. The trainer ledger (:mod:`gateways.membership.trainer_ledger`) counts
a push (at-least-once: acknowledged when a result counts it) only as a whole, and the engine folds, carries
and re-sends whole contributions. So pieces are collected per (iteration, layer) of one trainer session
until they cover every block; only then does the push exist for the ledger and the engine
(``RoundEngine.local_push``). Meanwhile each piece is also offered to the engine
(``RoundEngine.local_piece``), which may forward slices of it at once (that is the point of streaming).
A session that ends mid-push leaves nothing behind here: its pieces are dropped, the push was never
counted, and the trainer re-sends it whole or in pieces.

Bounds (every check before anything is kept): a piece's range and blocks are checked by the message
itself; here the pieces of one push must agree on the layer's shape and value dtype, must not overlap,
are at most :data:`MAX_PIECES_PER_PUSH`, and at most :data:`MAX_OPEN_PUSHES` pushes are partially here at
a time. The bytes kept are the decoded pieces (each bounded by the frame limit), at most one layer per
open push.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Final

from gateways.rounds.aggregate import concat_segments
from wanrt.errors import LimitExceeded, MalformedPayload, RemoteProtocolError
from wanrt.payload import SparsePayload, n_blocks
from wanrt.protocol import PushPiece

__all__ = ["MAX_OPEN_PUSHES", "MAX_PIECES_PER_PUSH", "PushStreams"]

#: Pushes partially received at a time. A trainer streams one layer after the other; a few in flight
#: (interleaved by a writer) are fine, hundreds are a bug or an attack.
MAX_OPEN_PUSHES: Final = 8

#: Pieces per push: a 1 GB layer cut in 1 MiB pieces is 1 000.
MAX_PIECES_PER_PUSH: Final = 4096

Key = tuple[int, int]


@dataclass(slots=True)
class _Open:
    shape: tuple[int, int, str]  # (dense_len, block_size, value_dtype)
    total: int  # blocks of the layer
    covered: int = 0
    los: list[int] = field(default_factory=list)
    parts: list[tuple[int, int, SparsePayload]] = field(default_factory=list)


class PushStreams:
    """The streamed pushes of one trainer session being put together."""

    def __init__(self, *, max_open: int = MAX_OPEN_PUSHES, max_pieces: int = MAX_PIECES_PER_PUSH) -> None:
        self.max_open = max_open
        self.max_pieces = max_pieces
        self._open: dict[Key, _Open] = {}

    @property
    def pending(self) -> int:
        """Pushes partially received."""
        return len(self._open)

    def add(self, piece: PushPiece, payload: SparsePayload | None = None) -> SparsePayload | None:
        """Take one piece (``payload`` replaces its payload, e.g. emptied for NaN/Inf); return the whole
        push once the pieces cover every block, else None."""
        p = piece.payload if payload is None else payload
        key = (piece.iteration, piece.layer)
        st = self._open.get(key)
        shape = (p.dense_len, p.block_size, p.value_dtype)
        if st is None:
            if len(self._open) >= self.max_open:
                raise LimitExceeded(
                    "too many streamed pushes in flight",
                    name="MAX_OPEN_PUSHES",
                    limit=self.max_open,
                    value=len(self._open) + 1,
                    peer="trainer",
                )
            st = _Open(shape, n_blocks(p.dense_len, p.block_size))
        elif shape != st.shape:
            raise MalformedPayload(
                "pieces of one push disagree on the layer's shape or dtype", peer="trainer", value=shape
            )
        lo, hi = piece.lo, piece.hi
        i = bisect.bisect_left(st.los, lo)
        if (i > 0 and st.parts[i - 1][1] > lo) or (i < len(st.parts) and st.parts[i][0] < hi):
            raise RemoteProtocolError("pieces of one push overlap", peer="trainer", value=(lo, hi))
        if len(st.parts) >= self.max_pieces:
            raise LimitExceeded(
                "too many pieces in one push",
                name="MAX_PIECES_PER_PUSH",
                limit=self.max_pieces,
                value=len(st.parts) + 1,
                peer="trainer",
            )
        self._open[key] = st
        st.los.insert(i, lo)
        st.parts.insert(i, (lo, hi, p))
        st.covered += hi - lo
        if st.covered < st.total:
            return None
        del self._open[key]
        parts = [q for _, _, q in st.parts]
        whole = parts[0] if len(parts) == 1 else concat_segments(parts)
        if whole.value_dtype != p.value_dtype:  # no block at all: concat_segments cannot tell the dtype
            whole = SparsePayload.empty(p.layer, p.dense_len, p.block_size, p.value_dtype)
        return whole

    def clear(self) -> None:
        """The session ended: what is partially here is dropped (never counted)."""
        self._open.clear()
