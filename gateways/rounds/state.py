"""Mutable bookkeeping of the round engine: one open round, the per-layer carry, and counters.

Kept apart from :mod:`gateways.rounds.engine` so the engine file reads as the protocol (who sends what
when) and
this one as the data it keeps. The invariant everything here serves: every push from the local trainers
is, at any moment, in exactly one place — an open round (``local`` or ``own``), the layer's carry, or a
final result — so nothing is lost when rounds are skipped, re-run or settled after a partition.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy.typing as npt

from gateways.rounds.aggregate import aggregate
from gateways.rounds.topology import Plan
from wanrt.payload import SparsePayload
from wanrt.protocol.peer.contrib_ids import merge_ids
from wanrt.protocol.peer.round_msg import ContribId, RoundMsg

__all__ = ["Carry", "EngineStats", "OpenRound", "merge_ids"]


@dataclass(slots=True)
class Carry:
    """What this site still owes a layer: contributions that missed their round (with their ids) plus the
    gateway residual of bounded forwarding (mass without ids, already counted by id elsewhere)."""

    payload: SparsePayload | None = None
    ids: tuple[ContribId, ...] = ()

    def add(self, payload: SparsePayload | None, ids: tuple[ContribId, ...] = ()) -> None:
        if payload is not None:
            self.payload = payload if self.payload is None else aggregate([self.payload, payload])
        if ids:
            self.ids = merge_ids(self.ids, ids)

    @property
    def empty(self) -> bool:
        return not self.ids and (self.payload is None or self.payload.nnz_blocks == 0)


@dataclass(slots=True, eq=False)
class OpenRound:
    """State of (iteration, layer) at this gateway until its final result is known here.

    ``local`` is the trainers' push for this iteration not yet folded into ``own``; ``own``/``own_ids`` is
    this site's contribution once taken (local + carry), retained until the final says whether it counted,
    so a re-run after a plan change can resend it and a miss can be carried to the next round.
    """

    iteration: int
    layer: int
    plan: Plan
    opened_at: float
    first_opened: float
    age_base: int
    local: SparsePayload | None = None
    local_at: float | None = None
    own: SparsePayload | None = None
    own_ids: tuple[ContribId, ...] = ()
    taken: bool = False
    gathered: bool = False
    inputs: dict[str, RoundMsg] = field(default_factory=dict)
    extras_in: dict[str, tuple[SparsePayload | None, tuple[ContribId, ...]]] = field(default_factory=dict)
    extras_out: list[tuple[SparsePayload | None, tuple[ContribId, ...]]] = field(default_factory=list)
    late: set[str] = field(default_factory=set)
    ring_slices: list[SparsePayload | None] | None = None
    ring_ids: tuple[ContribId, ...] = ()
    ring_recv: dict[int, RoundMsg] = field(default_factory=dict)
    ring_step: int = 0
    whole: bool = False  # all-pairs: this member sent its contribution whole (a direct round if all did)
    #: all-pairs two-hop, per piece k of the owned segment: (core positions summed so far, running sum)
    ap_sums: dict[int, tuple[int, SparsePayload | None]] = field(default_factory=dict)
    #: all-pairs: parts received, keyed (sender's core position, piece); a whole part fills every piece
    ap_recv: dict[tuple[int, int], RoundMsg] = field(default_factory=dict)
    #: all-pairs two-hop: finished pieces, keyed (segment, piece); the direct round uses ``seg_finals``
    ap_finals: dict[tuple[int, int], RoundMsg] = field(default_factory=dict)
    seg_finals: dict[int, RoundMsg] = field(default_factory=dict)
    #: all-pairs two-hop, dense layer: the result's values, filled as finished pieces arrive, and how many
    #: pieces are in it (-1: not every piece is dense; the result is concatenated at the end instead)
    ap_buf: npt.NDArray[Any] | None = None
    ap_staged: int = 0
    #: pieces staged in ``ap_buf`` not yet handed to the trainer (``(lo, hi, payload)``), how many were
    #: (``DeliverPiece``), and whether this round streams no more (a re-run: its pieces may differ)
    ap_fresh: list[tuple[int, int, SparsePayload]] = field(default_factory=list)
    ap_streamed: int = 0
    ap_stream_off: bool = False
    #: streamed push (all-pairs): pieces of this site's coming push, ``(lo, hi, payload)`` sorted by ``lo``,
    #: and the (piece, segment) slices already forwarded from them under plan ``pre_plan``
    pre_parts: list[tuple[int, int, SparsePayload]] = field(default_factory=list)
    pre_sent: set[tuple[int, int]] = field(default_factory=set)
    pre_plan: int = -1
    residuals: dict[int, SparsePayload] = field(default_factory=dict)
    wait_peer: str | None = None
    #: peers this site sent a message of this round to: any of them may answer with the result
    asked: set[str] = field(default_factory=set)
    wait_since: float = 0.0
    wait_reason: str = ""
    suspected: bool = False
    timer: float | None = None

    def holds_nothing(self) -> bool:
        """Nothing received, taken or sent here: a round that can be dropped and opened again later."""
        return (
            self.local is None
            and self.own is None
            and not self.own_ids
            and not self.taken
            and not self.inputs
            and not self.extras_in
            and not self.extras_out
            and self.ring_slices is None
            and not self.ring_recv
            and not self.seg_finals
            and not self.ap_sums
            and not self.ap_recv
            and not self.ap_finals
            and not self.residuals
        )

    def restart(self, plan: Plan, now: float) -> list[tuple[SparsePayload | None, tuple[ContribId, ...]]]:
        """Forget everything received under the old plan (its senders keep their own contributions).

        Returns the extras this site had sent under the old plan: they must be sent again."""
        self.plan = plan
        self.opened_at = now
        self.gathered = False
        self.inputs.clear()
        self.extras_in.clear()
        resend, self.extras_out = self.extras_out, []
        self.ring_slices = None
        self.ring_ids = ()
        self.ring_recv.clear()
        self.ring_step = 0
        self.whole = False
        self.ap_sums.clear()
        self.ap_recv.clear()
        self.ap_finals.clear()
        self.ap_buf, self.ap_staged = None, 0
        self.ap_fresh.clear()
        self.ap_stream_off = self.ap_stream_off or self.ap_streamed > 0
        self.seg_finals.clear()
        self.wait_peer = None
        self.suspected = False
        return resend


@dataclass(slots=True)
class EngineStats:
    """Counters for telemetry and tests; each names an event that is legal but worth watching."""

    rounds_closed: int = 0
    late_inputs: int = 0  # a child's partial arrived after its parent had moved on (x-order)
    carried: int = 0  # own contributions folded into a later round
    extras: int = 0  # ... of which sent ahead to the parent on their own
    restarts: int = 0  # open rounds re-run under a new plan
    final_replies: int = 0  # finished results sent to peers re-running a round
    stale_ignored: int = 0  # messages for rounds already settled here
    buffered: int = 0  # messages held for a plan not adopted yet
    buffer_dropped: int = 0  # ... dropped because the per-peer buffer was full or the message went stale
    conflicts: int = 0  # two different finals for one round (only after a finalizer failed mid-broadcast)
    foreign_finals: int = 0  # finals from a site that is not this site's parent in the round's plan: ignored
    settled: int = 0  # rounds settled from a peer's outcome after a partition
    diverged: int = 0  # own contributions of a round finished here but re-run by the others without them
    unresolved: int = 0  # ... whose outcome was older than the peer's history: carried, maybe twice
    abandoned: int = 0  # rounds unresolved after max_lag iterations: carried, maybe twice
    suspects: int = 0
    streamed_slices: int = 0  # all-pairs slices forwarded from a streamed push before it was whole
