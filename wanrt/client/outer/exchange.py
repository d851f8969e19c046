"""The context's side of an outer loop: inner steps that exchange nothing, and a push of ``.grad`` as set.

Under :class:`wanrt.DiLoCo` (arXiv 2311.08105 Algorithm 1) a WAN iteration is a round of H inner steps:
the backward hooks only mark their layer (the reducer is held), :meth:`OuterExchange.local_step` ends an
inner step, and the outer step pushes every parameter's ``.grad`` — the pseudo-gradient the loop wrote
there, no backward needed — through the ordinary path (in-site reduce, leader compression with error
feedback, gateways), then ends the WAN iteration as any step does. The tensor API
(wanrt/client/tensor_api.py) pushes its tensors the same way, split in :meth:`begin` and :meth:`end` so the
caller's work overlaps the exchange, and asks for ``synchronous`` steps (each waits for its own result).

Why a step under an outer loop applies exactly the updates at the staleness bound (:meth:`apply_upto`): a
per-step exchange may apply an update at whichever step it arrives (only the order of the updates must
match across sites), but an outer loop restarts every round from the parameters after the step, so every
site's step must apply the same updates for the sites to stay bit-identical after each outer step.
"""

from __future__ import annotations

from collections.abc import Callable

from wanrt.client.site.grad_reduce import LayerReducer

__all__ = ["OuterExchange"]


class OuterExchange:
    """One context's outer-loop driving; built by ``Context.attach(..., outer_loop=True)``."""

    def __init__(
        self,
        reducer: LayerReducer,
        *,
        check: Callable[[], None],
        end_iteration: Callable[[], None],
        synchronous: bool,
    ) -> None:
        self._reducer = reducer
        self._check = check
        self._end_iteration = end_iteration
        #: every step waits for its own iteration's updates, whatever the staleness setting
        self.synchronous = synchronous
        #: inner steps of the current WAN iteration (its telemetry divides the round's compute by them)
        self.inner = 0
        #: layers whose push this iteration is empty, their residual untouched (Streaming DiLoCo: the
        #: fragments not synchronised now); set by the outer loop between steps
        self.silent: frozenset[int] = frozenset()
        self._on_close: list[Callable[[], None]] = []

    def local_step(self) -> None:
        """End one inner step: the backward's hook marks are cleared, nothing is exchanged, the WAN
        iteration does not advance."""
        self._check()
        self._reducer.finish()  # held: only clears the marks of this inner step's backward
        self.inner += 1

    def begin(self) -> None:
        """Push every parameter's ``.grad`` as this WAN iteration's contribution (the leader compresses
        and sends it from its worker thread while the caller goes on)."""
        self._check()
        self._reducer.finish()  # the last inner backward's marks
        self.inner += 1
        self._reducer.issue_all()  # in the fixed layer order, on every rank alike

    def end(self) -> None:
        """Wait for the iteration's updates, apply them, switch settings: the rest of the step."""
        self._check()
        self._end_iteration()

    def step(self) -> None:
        self.begin()
        self.end()

    def iteration_done(self) -> int:
        """The WAN iteration ended: how many inner steps it took (at least 1); the count restarts."""
        n, self.inner = max(1, self.inner), 0
        return n

    def bound(self, staleness: int) -> int:
        return 0 if self.synchronous else staleness

    @staticmethod
    def apply_upto(step: int, bound: int, *, final: bool) -> int:
        """The newest iteration whose updates step ``step`` applies: exactly the staleness bound's (all of
        them at a close's final exchange)."""
        return step if final else step - bound

    def on_close(self, hook: Callable[[], None]) -> None:
        """Run ``hook()`` when the context closes, before its final exchange (DiLoCo: back to the anchor)."""
        self._on_close.append(hook)

    def closing(self) -> None:
        for hook in self._on_close:
            hook()
