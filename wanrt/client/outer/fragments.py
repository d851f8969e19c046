"""Streaming DiLoCo's fragments (Douillard et al., arXiv 2501.18512): which layers an outer step
synchronises, and which layers' outer updates a step lands.

§2.2 of the paper splits the model into P fragments and synchronises them in a staggered schedule: one
fragment per exchange, each fragment every H inner steps, so the peak bandwidth is 1/P of DiLoCo's. The
paper's best pattern is *strided* (transformer block i in fragment i mod P, so every fragment spans the
depth of the network); wanrt's layers are the parameters in model order, so fragment p holds the
parameters i with i mod P = p. (A fragment's size is then whatever its parameters hold; a balancing by
element count would even the exchanges out further.)

§2.3 overlaps a fragment's exchange with the next inner steps: its averaged outer update lands τ steps late
and is *mixed* into the local copy, θ_local ← α·θ_local + (1 − α)·θ_global. In wanrt the exchange pushed at
WAN iteration k lands at the step of iteration k + staleness (exactly there at every site:
:meth:`wanrt.client.outer.exchange.OuterExchange.apply_upto`), so τ = staleness × H/P inner steps, and
:class:`Landings` says which layers landed at a step.
"""

from __future__ import annotations

import torch

__all__ = ["Landings", "fragment_layers"]


def fragment_layers(iteration: int, n_layers: int, fragments: int) -> frozenset[int]:
    """The layers WAN iteration ``iteration`` synchronises: fragment ``iteration mod fragments``, strided."""
    if fragments <= 1:
        return frozenset(range(n_layers))
    p = iteration % fragments
    return frozenset(range(p, n_layers, fragments))


class Landings:
    """The fragments pushed and not landed yet, by iteration (the same at every site: the schedule is a
    function of the job's iteration and the settings in force). A push that lands only after its
    fragment's next exchange (staleness ≥ P) keeps this rank's own progress it carried, ``moved`` (−Δ per
    layer), so that the next Δ does not count it again and the landing can swap it for the job's update
    (:meth:`wanrt.client.outer.diloco.DiLoCo._outer_step`)."""

    def __init__(self) -> None:
        self._pushed: dict[int, tuple[frozenset[int], dict[int, torch.Tensor] | None]] = {}

    def pushed(self, iteration: int, layers: frozenset[int], moved: dict[int, torch.Tensor] | None) -> None:
        self._pushed[iteration] = (layers, moved)

    def in_flight(self, layer: int) -> list[torch.Tensor]:
        """This rank's progress in the pending pushes of ``layer`` that keep it."""
        return [m[layer] for _, m in self._pushed.values() if m is not None and layer in m]

    def landed(self, upto: int) -> dict[int, list[torch.Tensor] | None]:
        """Layer → the progress its landing pushes kept (None: pushes that land before the fragment's next
        exchange, mixed as §2.3 says), for every push of an iteration ``<= upto``."""
        out: dict[int, list[torch.Tensor] | None] = {}
        for it in sorted(k for k in self._pushed if k <= upto):
            layers, moved = self._pushed.pop(it)
            for layer in layers:
                if moved is None:
                    out.setdefault(layer, None)
                else:
                    kept = out.get(layer) or []
                    out[layer] = [*kept, moved[layer]]
        return out

    def clear(self) -> None:
        self._pushed.clear()
