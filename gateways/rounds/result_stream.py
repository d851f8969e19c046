"""Which finished pieces of a round's result go to the trainer early, and whether they are its result.

Why. Under all-pairs cut-through a dense layer's result is staged piece by piece into one buffer as each
piece is final here (:func:`gateways.rounds.allpairs.stage_final`). Handing each piece to the trainer at
once (``RoundConfig.stream_results``, :mod:`wanrt.protocol.streamed_results`) means that when the round
ends the trainer holds all but the last piece, instead of receiving and decoding the whole layer after the
round's last byte (a 25 M-element fp16 layer: 50 MB; docs/round_bench.md, "Session 11").

Pieces handed over are provisional. They are the result only if the result is the very buffer they were
staged in, every piece staged was handed over, the round was made here (not a result received from a peer)
and was never re-run under a new plan (``OpenRound.restart`` stops a round's streaming for good: a re-run
stages pieces of other sums). The engine's :class:`~gateways.rounds.actions.Deliver` says so
(``streamed``); otherwise the trainer is sent the whole result and drops the pieces.
"""

from __future__ import annotations

from gateways.rounds.actions import Action, DeliverPiece
from gateways.rounds.state import OpenRound
from wanrt.payload import SparsePayload

__all__ = ["stream_fresh", "streamed_result"]


def stream_fresh(r: OpenRound, enabled: bool, out: list[Action]) -> None:
    """Append a :class:`DeliverPiece` for every piece of ``r`` staged since the last call (if ``enabled``
    and ``r`` still streams); the staged list is emptied either way."""
    if not r.ap_fresh:
        return
    if enabled and not r.ap_stream_off:
        for lo, hi, p in r.ap_fresh:
            out.append(DeliverPiece(r.iteration, r.layer, lo, hi, p))
        r.ap_streamed += len(r.ap_fresh)
    r.ap_fresh.clear()


def streamed_result(r: OpenRound, payload: SparsePayload | None, made_here: bool) -> int:
    """How many pieces handed over make up ``payload``, the result ``r`` closes with (0: not all of them
    are the result's, or none was handed over)."""
    whole = made_here and not r.ap_stream_off and payload is not None and payload.values is r.ap_buf
    return r.ap_streamed if whole and r.ap_streamed == r.ap_staged else 0
