"""What one gateway's round engine says to another (:class:`RoundMsg`): the peer message of a round.

It lives on the ground floor with the other wire schemas because both ends of a gateway-to-gateway link,
the frame encoder (:mod:`wanrt.protocol.peer.round_frames`) and the simulator read it; what the engine asks
its driver to do with such messages (send, deliver, telemetry) is :mod:`gateways.rounds.actions`.

Why ids instead of site names. A contribution that misses its round is not lost: its originator folds it
into the next round of the same layer (STAR §IV-B x-order, "proceed without the straggler"). So an
aggregate is the sum of *pushes*, each named by a contribution id ``(site, iteration)``; an aggregate for
iteration 7 may hold ``("c", 6)`` next to ``("c", 7)``. The sum over every delivered aggregate then accounts
for every push exactly once, and a trainer that averages divides by ``len(sites)``.

Mapping onto ``wanrt.protocol`` (done by the daemon): ``partial``, ``extra`` and ``segment`` travel as
``Push``, ``segment_final`` and ``final`` as ``Aggregate``; they additionally need ``kind``, ``plan_id``,
``step``, ``segment`` and ``sites`` as (site, iteration) pairs. ``outcome`` carries no payload.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

from wanrt.payload import SparsePayload

__all__ = ["MSG_KINDS", "ContribId", "MsgKind", "RoundMsg"]

#: (site, iteration) of one push from a site's trainers.
ContribId: TypeAlias = tuple[str, int]

MsgKind: TypeAlias = Literal["partial", "extra", "segment", "segment_final", "final", "outcome"]
MSG_KINDS: tuple[MsgKind, ...] = ("partial", "extra", "segment", "segment_final", "final", "outcome")


@dataclass(frozen=True, slots=True, eq=False)
class RoundMsg:
    """One gateway-to-gateway message of a round.

    * ``partial`` — child → parent: the sum of the child's subtree (upward, x-order applies); one per child
      and round, it completes the child's part of the round.
    * ``extra`` — child → parent: contributions the child carries from rounds that finished without them,
      sent ahead into the round the parent gathers next (``step`` of the parent's last ``final``) so that a
      persistent straggler's pushes are counted without waiting for its next on-time push. Added to the
      round if it arrives before the parent moves on; it does not complete the child's part.
    * ``segment`` — ring reduce-scatter: segment ``segment`` accumulated over ``step + 1`` ring members.
    * ``segment_final`` — ring all-gather: the finished segment ``segment``.
    * ``final`` — the round's result (downward to children; also the answer to anyone re-running a round
      that is already finished here). ``step`` is the sender's fold hint: the lowest iteration of this layer
      it has not gathered yet, where a child's ``extra`` will still count.
    * ``outcome`` — to a rejoining site: ``sites`` lists its contributions (pushed before ``iteration``, the
      join iteration) counted in results of layer ``layer`` for rounds ``step`` and later (``step`` is the
      oldest round the sender remembers); ``payload`` is ``None`` and ``plan_id`` 0.

    ``plan_id`` is the :attr:`~gateways.rounds.topology.Plan.plan_id` the message was produced under.
    ``payload`` is
    ``None`` only when nothing at all is known about the layer's shape (an empty contribution).
    """

    kind: MsgKind
    iteration: int
    layer: int
    plan_id: int
    payload: SparsePayload | None
    sites: tuple[ContribId, ...]
    step: int = 0
    segment: int = -1
