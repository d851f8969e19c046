"""``wanrt.SparseOptimizer``: the one object a training loop swaps in for ``torch.optim.Adam`` & co.

``step()`` does not apply the local gradient: it ends the iteration on the wanrt context, which applies the
*global* sparse updates (averaged over sites) with a :mod:`wanrt.kernels` sparse optimizer whose cost is
proportional to the number of selected elements (StellaTrain §3.1). Optimizer state is per layer inside the
kernel and identical on every rank, because every rank applies the same updates in the same order.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from wanrt.client.context import Context
from wanrt.errors import ConfigError
from wanrt.kernels import make_sparse_optimizer

__all__ = ["SparseOptimizer"]

ParamsArg = Iterable[torch.Tensor] | Iterable[tuple[str, torch.Tensor]] | torch.nn.Module


def named_trainable(params: ParamsArg) -> list[tuple[str, torch.Tensor]]:
    """Accept ``model``, ``model.named_parameters()`` or ``model.parameters()``; keep trainable ones.

    Names make mismatch errors readable; bare tensors are named by position.
    """
    items: list[tuple[str, torch.Tensor]] = []
    source: Iterable[Any] = params.named_parameters() if isinstance(params, torch.nn.Module) else params
    for i, item in enumerate(source):
        if isinstance(item, torch.Tensor):
            items.append((f"param{i}", item))
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], torch.Tensor):
            items.append((str(item[0]), item[1]))
        else:
            raise ConfigError(
                f"SparseOptimizer params item {i} is {type(item).__name__}, not a tensor or (name, tensor)",
                key="params",
            )
    return [(n, p) for n, p in items if p.requires_grad]


class SparseOptimizer:
    """Drop-in for a torch optimizer in a wanrt job: ``loss.backward(); opt.step()``.

    ``kind`` is ``"sgd"``, ``"momentum"``, ``"adam"`` or ``"adamw"``; ``hyper`` goes to the kernel
    (``lr=...``, ``betas=...``, ...). Constructing it binds the model to ``ctx``, a collective on every rank
    of the site; on the leader it also opens the connection to the gateway (with the model signature).
    """

    def __init__(self, params: ParamsArg, kind: str = "adam", *, ctx: Context, **hyper: Any) -> None:
        named = named_trainable(params)
        self.ctx = ctx
        self.kind = kind
        self._params = [p for _, p in named]
        self._kernel = make_sparse_optimizer(kind, **hyper)
        ctx.attach(named, self._kernel)

    @property
    def params(self) -> list[torch.Tensor]:
        return list(self._params)

    @property
    def lr(self) -> float:
        """The learning rate you set (``hyper["lr"]``, or a schedule's value: ``opt.lr = sched(t)``). Set it
        on every rank of the site alike, as with any torch optimizer in data-parallel training."""
        return self._kernel.lr

    @lr.setter
    def lr(self, value: float) -> None:
        self._kernel.lr = value

    @property
    def lr_scale(self) -> float:
        """The job's live factor on :attr:`lr` (scheduler-set, read-only here): a step applies
        ``lr × lr_scale``. Kept apart so a schedule that sets ``lr`` keeps the scale."""
        return self._kernel.lr_scale

    @property
    def effective_lr(self) -> float:
        """What the next update applies: ``lr × lr_scale``."""
        return self._kernel.effective_lr

    def state_dict(self) -> dict[str, Any]:
        """A checkpoint of everything the optimizer adds to the model's parameters: per-parameter state
        (momentum; Adam's moments and step counters), ``lr`` and the live ``lr_scale``, the settings in
        force, the iteration, and on the site leader the error-feedback residuals and the compressor's
        thresholds. Take it after ``ctx.close()`` (or at staleness 0 between steps); save it beside
        ``model.state_dict()`` (docs/client.md, "Checkpoint and resume")."""
        return self.ctx.optimizer_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` before the first step of a run started with
        ``wanrt.init(..., resume_at=state["iteration"])``."""
        self.ctx.load_optimizer_state(state)

    def step(self) -> None:
        """End the iteration: apply the global updates due now (see :meth:`Context.step`)."""
        self.ctx.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients, except between the micro-steps of one WAN iteration (``local_steps`` > 1,
        ElasticBSP §4): there they hold the partial sum the last micro-step pushes, and the user's loop
        calls ``zero_grad()`` every batch as it would without wanrt."""
        if self.ctx.accumulating:
            return
        for p in self._params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_()
                p.grad.zero_()
