"""What the site leader's link keeps so that a restarted gateway loses none of its pushes (sans-IO).

A gateway that dies takes with it what it held for its trainer: pushes not yet counted, results not yet
read. The gateway acknowledges a ``Push(iteration, layer)`` with ``Ack(iteration, layer, 0)`` only once a
result counted it (gateways/membership/trainer_ledger.py), so the trainer keeps every push until that ack
and, after reconnecting, sends again what was never acknowledged; the restarted gateway settles each with
the other sites' ``outcome`` records (counted: acknowledged; not: folded into a later push) and answers
every pushed (iteration, layer) once — with the result, or an empty one. This is what the chaos soak's test
trainer does end to end (tools/chaos_trainer.py, docs/chaos.md); :class:`ReconnectPolicy`,
:class:`UnackedPushes` and :class:`Outstanding` are the same mechanism for the public link
(:mod:`wanrt.client.link.gateway_link`), which also asks again for a parameter snapshot still owed.

Results a reconnect brings twice (the gateway re-sends the results whose trainer ack was lost with the
connection) are dropped here: the training loop treats an update it did not wait for as a protocol error.
A restarted gateway that joined the job at ``join_at`` (its Welcome says so) never sends the results of
rounds before it: the pushes still waiting for those are answered with empty updates (as the chaos soak's
trainer skips them), and the gateway's ``resync`` notice brings the parameters that hold those results.
Left open: results a dying gateway had made but not yet sent, for a restart the job did not move past
(``join_at`` = its own frontier + 1, so no ``resync`` notice), are not recovered.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from wanrt.config import check
from wanrt.errors import LimitExceeded
from wanrt.payload import SparsePayload

__all__ = ["MAX_UNACKED_PUSHES", "Backoff", "Outstanding", "ReconnectPolicy", "UnackedPushes"]

Key = tuple[int, int]  # (iteration, layer)

#: Pushes kept unacknowledged at most. A trainer waits for results ``staleness`` iterations back, and a
#: result acknowledges the pushes it counted, so a healthy link holds about ``staleness + 2`` iterations of
#: layers; past this bound the gateway has stopped counting and the link fails instead of growing.
MAX_UNACKED_PUSHES: Final = 65_536


@dataclass(frozen=True)
class ReconnectPolicy:
    """How the link reconnects to a gateway it lost (not one that refused it: wrong secret, other model,
    a protocol violation — those fail at once). Backoff doubles from ``initial_s`` to ``max_s``; after
    ``give_up_s`` without a gateway the link fails with :class:`~wanrt.errors.PeerLost`."""

    enabled: bool = True
    initial_s: float = 0.1
    max_s: float = 2.0
    give_up_s: float = 120.0  # as long as ClientConfig.update_deadline_s: a restart within it is invisible

    @classmethod
    def lasting(cls, give_up_s: float) -> ReconnectPolicy:
        """The policy of ``ClientConfig.reconnect_s``: redial for that long; 0 disables reconnecting."""
        return cls(enabled=False) if give_up_s <= 0 else cls(give_up_s=give_up_s)

    def __post_init__(self) -> None:
        check(0 < self.initial_s <= 60, "reconnect.initial_s", self.initial_s, "in (0, 60] s")
        check(self.initial_s <= self.max_s <= 600, "reconnect.max_s", self.max_s, "in [initial_s, 600] s")
        check(0 < self.give_up_s <= 86_400, "reconnect.give_up_s", self.give_up_s, "in (0, 86400] s")


class Backoff:
    """Delays between attempts, and whether to give up; ``now`` passed in (sans-IO)."""

    def __init__(self, policy: ReconnectPolicy, now: float) -> None:
        self._policy = policy
        self._next = policy.initial_s
        self._until = now + policy.give_up_s

    def delay(self, now: float) -> float | None:
        """Seconds to wait before the next attempt, or None once ``give_up_s`` has passed."""
        if now >= self._until:
            return None
        out = min(self._next, self._until - now)
        self._next = min(self._policy.max_s, self._next * 2)
        return out


class UnackedPushes:
    """Pushes the gateway has not acknowledged, in push order per key; a push of the same key again (a
    re-send) replaces the kept one."""

    def __init__(self, limit: int = MAX_UNACKED_PUSHES) -> None:
        self._kept: dict[Key, SparsePayload] = {}
        self._limit = limit

    def note(self, iteration: int, layer: int, payload: SparsePayload) -> None:
        self._kept[(iteration, layer)] = payload
        if len(self._kept) > self._limit:
            raise LimitExceeded(
                "the gateway acknowledges none of this trainer's pushes",
                name="MAX_UNACKED_PUSHES",
                limit=self._limit,
                value=len(self._kept),
            )

    def ack(self, iteration: int, layer: int) -> bool:
        return self._kept.pop((iteration, layer), None) is not None

    def pending(self) -> Iterator[tuple[int, int, SparsePayload]]:
        """Oldest first: the order a gateway counts them in."""
        for (it, layer), p in sorted(self._kept.items(), key=lambda kv: kv[0]):
            yield it, layer, p

    def __len__(self) -> int:
        return len(self._kept)


class Outstanding:
    """The (iteration, layer)s pushed and not yet answered, and what to do with a result:

    * for a key waiting: deliver it;
    * for a key pushed and already answered: a duplicate a reconnect brought — dropped and counted;
    * for a key not pushed yet: held until the trainer pushes it, then delivered as its answer. A gateway
      restarted past its trainer does this (it delivers the job's results from its join on, while its
      trainer still catches up), and so does any round that closed without this site (x-order, a quorum
      that went on without a late site): its result may come while the trainer is still pushing the
      iteration's other layers. The training loop would refuse an update it did not wait for.

    A trainer pushes every layer of an iteration before any of the next, so "pushed" is: an older
    iteration than the newest one pushed, or one of the newest iteration's layers pushed so far.
    """

    def __init__(self, limit: int = MAX_UNACKED_PUSHES) -> None:
        self._waiting: set[Key] = set()
        self._early: dict[Key, object] = {}
        self._top = -1  # the newest pushed iteration
        self._top_layers: set[int] = set()  # its layers pushed so far
        self._limit = limit
        self.duplicates = 0
        self.early = 0

    def pushed(self, iteration: int, layer: int) -> object | None:
        """A push: the result already held for it (deliver it now), else None (it waits)."""
        if iteration > self._top:
            self._top, self._top_layers = iteration, set()
        if iteration == self._top:
            self._top_layers.add(layer)
        held = self._early.pop((iteration, layer), None)
        if held is None:
            self._waiting.add((iteration, layer))
        return held

    def result(self, iteration: int, layer: int, event: object) -> object | None:
        """A result from the gateway: ``event`` to deliver now, or None (dropped, or held)."""
        key = (iteration, layer)
        if key in self._waiting:
            self._waiting.discard(key)
            return event
        if iteration < self._top or (iteration == self._top and layer in self._top_layers):
            self.duplicates += 1
            return None
        self._early[key] = event
        self.early += 1
        if len(self._early) > self._limit:
            raise LimitExceeded(
                "the gateway sent results for far more rounds than this trainer pushed",
                name="MAX_UNACKED_PUSHES",
                limit=self._limit,
                value=len(self._early),
            )
        return None

    def expects(self, iteration: int, layer: int) -> bool:
        """Whether a result for this round would be delivered or held (not dropped as a duplicate)."""
        if (iteration, layer) in self._waiting:
            return True
        return not (iteration < self._top or (iteration == self._top and layer in self._top_layers))

    def answered(self, iteration: int, layer: int) -> None:
        """Answered here (an empty update): it waits no longer."""
        self._waiting.discard((iteration, layer))

    def below(self, join_at: int) -> list[Key]:
        """The gateway will never send results for rounds before ``join_at`` (a restarted gateway's join,
        or the first iteration of a parameter resync: the job finished those rounds without this site).
        These keys stop waiting; the caller answers them with empty updates — the resync brings the
        parameters those results went into."""
        gone = sorted(k for k in self._waiting if k[0] < join_at)
        self._waiting.difference_update(gone)
        return gone

    def __len__(self) -> int:
        return len(self._waiting)
