"""Per-layer in-site gradient reduction started from backward hooks, so communication overlaps backward.

Each trainable parameter is one *layer* (its layer id is its position in the optimizer's parameter list).
``register_post_accumulate_grad_hook`` fires when a parameter's gradient for this backward pass is final; the
hook starts an asynchronous reduce (sum) of that gradient to the site leader, while autograd goes on with
the layers below (StellaTrain §3.3: the gradients of late layers are ready first and travel first).

Why reduce and not all-reduce: only the site leader compresses and pushes the averaged gradient; the other
ranks never read it (they apply the global sparse update the leader broadcasts). A ring all-reduce would
also deliver the sum to W-1 ranks that drop it.

Why a fixed issue order: gloo and NCCL match collectives by the order they are issued, so every rank must
start the reduces in the same order even if its hooks fire in another one. Layers are issued in reverse
parameter order (roughly backward order); a hook that fires early only marks its layer ready, and the
longest ready prefix of the order is issued. ``finish()`` issues whatever is left (a zero gradient for a
parameter that got none this step, identically on every rank), so no rank can deadlock waiting for a
collective another rank skipped.

Why a hold mode (``hold = True``): with local steps (ElasticBSP §4, ``ClientConfig.local_steps``) the first
k−1 micro-steps of a WAN iteration only accumulate into ``p.grad`` (autograd adds in place); a reduce then
would send a partial sum, and on the leader ``dist.reduce`` overwrites ``p.grad`` with the site's sum, which
the next micro-step would add to. Held micro-steps issue nothing, on every rank alike (the context sets
``hold`` at the same step on every rank), so the collective sequence still matches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from wanrt.errors import LocalProtocolError

__all__ = ["LayerReducer"]

#: called with (layer, pending work or None when there is nothing to wait for, gradient tensor)
OnIssued = Callable[[int, Any, torch.Tensor], None]


class LayerReducer:
    """Registers the hooks on ``params`` and issues one reduce per layer per step in a fixed order."""

    def __init__(
        self,
        params: Sequence[torch.Tensor],
        *,
        group: dist.ProcessGroup | None,
        world_size: int,
        dst: int,
        on_issued: OnIssued,
    ) -> None:
        self._params = list(params)
        self._group = group
        self._world = world_size
        self._dst = dst
        self._on_issued = on_issued
        self._order = list(range(len(self._params)))[::-1]
        self._ready = [False] * len(self._params)
        self._next = 0
        self._fired = 0
        #: accumulate only: hooks count and check, nothing is issued (set between steps, never during one)
        self.hold = False
        self._handles = [
            p.register_post_accumulate_grad_hook(self._make_hook(i)) for i, p in enumerate(self._params)
        ]

    @property
    def fired(self) -> int:
        """How many layer hooks fired since the last ``finish()`` (0 = no backward ran)."""
        return self._fired

    def _make_hook(self, layer: int) -> Callable[[torch.Tensor], None]:
        def hook(param: torch.Tensor) -> None:
            if self._ready[layer]:
                raise LocalProtocolError(
                    f"backward() produced a second gradient for layer {layer} before step()",
                    layer=layer,
                    hint="wanrt sends one gradient per layer per step: call opt.step() after each backward()"
                    " (for gradient accumulation, sum the losses before one backward())",
                )
            self._ready[layer] = True
            self._fired += 1
            if not self.hold:
                self._issue_ready()

        return hook

    def _issue_ready(self) -> None:
        while self._next < len(self._order) and self._ready[self._order[self._next]]:
            self._issue(self._order[self._next])
            self._next += 1

    def _issue(self, layer: int) -> None:
        p = self._params[layer]
        grad = p.grad
        if grad is None:  # no gradient this step: contribute zeros so the collective sequence matches
            grad = torch.zeros_like(p)
        work = None
        if self._world > 1:
            work = dist.reduce(grad, dst=self._dst, op=dist.ReduceOp.SUM, group=self._group, async_op=True)
        self._on_issued(layer, work, grad)

    def issue_all(self) -> None:
        """Issue every layer's current ``.grad`` now, in the fixed order, whether or not a backward ran:
        an outer loop sets the pseudo-gradients itself (wanrt.client.outer). Every rank calls it at the same
        step, so the collective sequence matches."""
        self._ready = [True] * len(self._params)
        self._next = 0
        self._issue_ready()
        self._ready = [False] * len(self._params)
        self._next = 0
        self._fired = 0

    def finish(self) -> int:
        """Issue every layer not issued yet (in order; nothing while held); return how many hooks fired.
        Resets for the next step."""
        fired = self._fired
        if fired and not self.hold:
            for i in range(len(self._ready)):
                self._ready[i] = True
            self._issue_ready()
        self._ready = [False] * len(self._params)
        self._next = 0
        self._fired = 0
        return fired

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
