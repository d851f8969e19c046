"""What the round engine asks its driver to do: send a :class:`~wanrt.protocol.peer.round_msg.RoundMsg` to a
peer, deliver a finished aggregate to the local trainers, report a closed round or a silent peer.

The engine is sans-IO (docs/gateway.md): it returns these actions and the gateway node (or the simulator)
carries them out. The message itself is a wire schema and lives on the ground floor
(:mod:`wanrt.protocol.peer.round_msg`); the actions are the gateway's own business.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from wanrt.payload import SparsePayload
from wanrt.protocol.peer.round_msg import ContribId, MsgKind, RoundMsg

__all__ = ["Action", "Deliver", "DeliverPiece", "PeerSuspect", "RoundClosed", "Send"]


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``msg`` to ``peer``; ``priority`` is the EDF key (earlier iteration, then lower layer, first)."""

    peer: str
    msg: RoundMsg
    priority: tuple[int, int]

    @property
    def iteration(self) -> int:
        return self.msg.iteration

    @property
    def layer(self) -> int:
        return self.msg.layer

    @property
    def kind(self) -> MsgKind:
        return self.msg.kind

    @property
    def payload(self) -> SparsePayload | None:
        return self.msg.payload

    @property
    def sites(self) -> tuple[ContribId, ...]:
        return self.msg.sites


@dataclass(frozen=True, slots=True)
class Deliver:
    """The final aggregate of (iteration, layer) for the local trainers: the sum over ``sites``.

    ``payload`` is ``None`` only if no contributor knew the layer's shape (nothing was pushed).
    ``streamed``: the number of :class:`DeliverPiece` s of this round delivered before it that make up
    ``payload`` exactly (0: none, or not all of them are the result's; the trainer needs ``payload``).
    """

    iteration: int
    layer: int
    payload: SparsePayload | None
    sites: tuple[ContribId, ...]
    streamed: int = 0


@dataclass(frozen=True, slots=True)
class DeliverPiece:
    """Blocks ``[lo, hi)`` of the result of (iteration, layer), final here while later pieces are still
    on the wire (all-pairs cut-through, ``RoundConfig.stream_results``): the daemon may pass it on to the
    trainer now (:mod:`wanrt.protocol.streamed_results`). Provisional: only the round's :class:`Deliver`
    says (``streamed``) whether the pieces delivered are its result."""

    iteration: int
    layer: int
    lo: int
    hi: int
    payload: SparsePayload


@dataclass(frozen=True, slots=True)
class RoundClosed:
    """Telemetry of a finished round at this gateway.

    ``missing`` are plan members with no contribution in the result; ``late`` are children this gateway
    proceeded without; ``delivered`` is false when the round was settled without a result reaching this
    site (after a partition: see ``outcome`` messages) or abandoned after ``max_lag`` iterations.
    """

    iteration: int
    layer: int
    sites: tuple[ContribId, ...]
    missing: tuple[str, ...]
    late: tuple[str, ...]
    duration: float
    delivered: bool = True


@dataclass(frozen=True, slots=True)
class PeerSuspect:
    """A peer the round cannot proceed without has been silent for ``waited`` seconds (``reason``:
    ``"ring"`` neighbour or ``"final"`` from the parent). The daemon decides whether to declare it lost."""

    peer: str
    iteration: int
    layer: int
    waited: float
    reason: str


Action: TypeAlias = Send | Deliver | DeliverPiece | RoundClosed | PeerSuspect
