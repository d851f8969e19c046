"""Which layer updates the site applies at which step: partial staleness, decided by the site leader.

StellaTrain §3.3 ("Partially stale update"): every layer's update may lag at most one iteration, but a layer
whose update is already back when the next step begins is applied fresh. Concretely, at the end of
iteration ``t`` with staleness bound ``s``:

* every update of an iteration ``<= t - s`` that has not arrived yet *must* be waited for (bounded by a
  deadline: the caller raises :class:`~wanrt.errors.WanrtTimeout`);
* every update of an iteration ``<= t`` that has arrived is applied now (fresh when it is ``t``'s own);
* everything else waits for a later step.

``s = 0`` is fully synchronous (wait for all of ``t``). Updates are applied oldest iteration first, then by
layer, so a layer never sees iteration ``t`` applied before ``t - 1``.

This object is sans-IO: the leader feeds it what it pushed and what arrived and asks it what to wait for and
what to apply; it never blocks, reads a clock or touches torch. It also rejects what a misbehaving gateway
might send (an update for a layer or iteration that was never pushed, or the same one twice).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from wanrt.errors import LocalProtocolError, RemoteProtocolError

__all__ = ["Ready", "StalenessTracker"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Ready(Generic[T]):
    iteration: int
    layer: int
    item: T


class StalenessTracker(Generic[T]):
    """Bookkeeping of pushed, arrived and applied (iteration, layer) updates for one site leader."""

    def __init__(self, n_layers: int, *, peer: str | None = None) -> None:
        if n_layers < 1:
            raise LocalProtocolError("a model needs at least one trainable layer", value=n_layers)
        self.n_layers = n_layers
        self._peer = peer
        # iteration -> layers pushed whose update has not arrived yet
        self._missing: dict[int, set[int]] = {}
        # (iteration, layer) -> arrived but not applied yet
        self._arrived: dict[tuple[int, int], T] = {}
        self._last_pushed = -1

    @property
    def last_pushed(self) -> int:
        return self._last_pushed

    def pushed(self, iteration: int, layer: int) -> None:
        """Record that this site pushed ``layer`` of ``iteration`` (iterations are pushed in order)."""
        if not 0 <= layer < self.n_layers:
            raise LocalProtocolError(f"layer {layer} out of range", value=layer, limit=self.n_layers)
        if iteration < self._last_pushed:
            raise LocalProtocolError(
                f"pushed iteration {iteration} after {self._last_pushed}", value=iteration
            )
        missing = self._missing.setdefault(iteration, set())
        if layer in missing:
            raise LocalProtocolError(f"layer {layer} of iteration {iteration} pushed twice")
        missing.add(layer)
        self._last_pushed = iteration

    def arrived(self, iteration: int, layer: int, item: T) -> None:
        """Record the gateway's update; anything we did not push (or got already) is the peer's fault."""
        missing = self._missing.get(iteration)
        if missing is None or layer not in missing:
            raise RemoteProtocolError(
                f"gateway sent an update for iteration {iteration} layer {layer}, which is not outstanding "
                "(never pushed, or already received)",
                peer=self._peer,
                iteration=iteration,
                layer=layer,
            )
        missing.discard(layer)
        if not missing:
            del self._missing[iteration]
        self._arrived[(iteration, layer)] = item

    def must_wait(self, step: int, bound: int) -> list[tuple[int, int]]:
        """Updates that step ``step`` cannot go without under staleness ``bound``, oldest first."""
        horizon = step - bound
        return sorted(
            (it, layer) for it, layers in self._missing.items() if it <= horizon for layer in layers
        )

    def outstanding(self) -> list[tuple[int, int]]:
        """Every pushed update that has not arrived (what a final flush must wait for)."""
        return sorted((it, layer) for it, layers in self._missing.items() for layer in layers)

    def unapplied(self) -> set[tuple[int, int]]:
        """Every pushed update not taken yet (missing or arrived): what a parameter snapshot lacks."""
        out = {(it, layer) for it, layers in self._missing.items() for layer in layers}
        out.update(self._arrived)
        return out

    def take_ready(self, step: int) -> list[Ready[T]]:
        """Remove and return every arrived update of an iteration ``<= step``, oldest iteration first."""
        keys = sorted(k for k in self._arrived if k[0] <= step)
        return [Ready(it, layer, self._arrived.pop((it, layer))) for it, layer in keys]
