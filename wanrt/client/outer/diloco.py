"""``wanrt.DiLoCo``: H local steps with any torch optimizer, then one exchange of the pseudo-gradient.

DiLoCo (Douillard et al., arXiv 2311.08105, Algorithm 1 and §3): every worker starts a round from the
shared parameters θ^{t−1} (the *anchor*), takes H inner steps with its own inner optimizer (AdamW in the
paper), and then the workers average the *outer gradient* Δ = θ^{t−1} − θ_i^t; an outer optimizer (Nesterov
momentum SGD, lr 0.7, momentum 0.9 in §3) applies the average to the anchor, and the result is the next
round's start at every worker.

How it sits on wanrt: the outer step *is* one WAN iteration of the existing machinery. The wrapper binds
the model to the context with the outer optimizer as the context's sparse kernel optimizer
(``momentum`` kind with Nesterov, or ``sgd`` without momentum); at the outer step it writes Δ into every
parameter's ``.grad``, puts the parameters back to the anchor and calls the context's step. So the
pseudo-gradient travels exactly as a gradient does: reduced to the site's mean inside the site, compressed
by the leader (top-k / threshold blocks, the handshake's wire dtype incl. int8/int4/int2) with error
feedback — what a round does not send stays in the residual and is added to the next round's Δ, as
SparseLoCo does with its pseudo-gradients — summed by the gateways, and applied at every rank of every
site by the same deterministic kernel, in the same order: every site holds bit-identical parameters after
each outer step. Kill/restart, resync, checkpoints and the scheduler's settings are those of the context:
a replacement trainer fetches the job's parameters *and* the outer optimizer's momentum (the kernel's
state) from another site.

What differs from the paper, and why:

* the outer momentum is the kernel's *lazy* momentum (wanrt/kernels/sparse_optim.py): with a sparse Δ it
  moves only the blocks that the round's average touched (StellaTrain §3.1); with ``density=1`` it is
  exactly ``torch.optim.SGD(momentum, nesterov=True)``;
* with ``ClientConfig.staleness`` ≥ 1 (the default 1) a round's average is applied one outer step late (the
  exchange overlaps the next H inner steps, as Streaming DiLoCo's overlapping does, arXiv 2501.18512 §2.3,
  without its α mixing); ``staleness=0`` is the paper's synchronous DiLoCo;
* ranks of one site each take their own inner steps (more DiLoCo workers, averaged inside the site first).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from wanrt.client.context import Context
from wanrt.client.optimizer import ParamsArg, named_trainable
from wanrt.errors import ConfigError, LocalProtocolError
from wanrt.kernels import make_sparse_optimizer

__all__ = ["DiLoCo"]

log = logging.getLogger(__name__)

#: DiLoCo §3's outer optimizer: Nesterov momentum, lr 0.7, momentum 0.9
OUTER_LR = 0.7
OUTER_MOMENTUM = 0.9
#: the most inner steps one round may take (bounds a typo; the paper's largest H is 2000)
MAX_SYNC_EVERY = 1 << 20


def _check_h(value: object, key: str) -> int:
    if type(value) is not int or not 1 <= value <= MAX_SYNC_EVERY:
        raise ConfigError(f"{key} must be an integer in [1, {MAX_SYNC_EVERY}], got {value!r}", key=key)
    return value


class DiLoCo:
    """An outer loop around your torch optimizer: ``loss.backward(); opt.step(); opt.zero_grad()``.

    ``inner_optimizer`` is any ``torch.optim`` optimizer over the same parameters (AdamW in DiLoCo §3); it
    steps every call. Every ``sync_every``-th call (H, :meth:`sync_every`) is also an outer step: the
    sites average the pseudo-gradient and apply it with the outer optimizer (Nesterov momentum SGD,
    ``outer_lr`` 0.7, ``outer_momentum`` 0.9: DiLoCo §3; ``outer_momentum=0`` is plain SGD, and
    ``outer_lr=1, outer_momentum=0`` makes the outer step the plain average of the sites' parameters).
    ``ctx.iteration`` counts outer steps: one gateway round per outer step.

    Construct it on every rank of the site, as a SparseOptimizer (it binds the model to ``ctx``).
    """

    def __init__(
        self,
        params: ParamsArg,
        inner_optimizer: torch.optim.Optimizer,
        *,
        ctx: Context,
        sync_every: int = 1,
        outer_lr: float = OUTER_LR,
        outer_momentum: float = OUTER_MOMENTUM,
        nesterov: bool = True,
    ) -> None:
        self._sync_every = _check_h(sync_every, "sync_every")
        named = named_trainable(params)
        if not isinstance(inner_optimizer, torch.optim.Optimizer):
            raise ConfigError(
                f"inner_optimizer is {type(inner_optimizer).__name__}, not a torch.optim.Optimizer",
                key="inner_optimizer",
            )
        ours = {id(p) for _, p in named}
        theirs = {id(p) for group in inner_optimizer.param_groups for p in group["params"]}
        if not theirs <= ours:
            raise ConfigError(
                "the inner optimizer steps parameters that the outer loop does not synchronise: build both "
                "from the same model's trainable parameters",
                key="inner_optimizer",
            )
        if not 0.0 <= outer_momentum < 1.0:
            raise ConfigError(
                f"outer_momentum must be in [0, 1), got {outer_momentum!r}", key="outer_momentum"
            )
        if outer_momentum > 0:
            kernel = make_sparse_optimizer(
                "momentum", lr=outer_lr, momentum=outer_momentum, nesterov=nesterov
            )
        else:  # plain SGD: nesterov has nothing to look ahead with
            kernel = make_sparse_optimizer("sgd", lr=outer_lr)
        self.ctx = ctx
        self.inner = inner_optimizer
        self._names = [n for n, _ in named]
        self._params = [p for _, p in named]
        self._kernel = kernel
        ctx.attach(named, kernel, outer_loop=True)
        self._exchange = ctx.outer_exchange
        with torch.no_grad():
            self._anchor = [p.detach().clone() for p in self._params]
        self._done = 0  # inner steps of the current round
        self._h = self.sync_every()
        self._exchange.on_close(self._back_to_anchor)

    # -- the round ---------------------------------------------------------------------------------------

    def sync_every(self) -> int:
        """H, the inner steps of the round that begins now: the job's decided ``outer_steps`` when the
        scheduler sets one (read from ``ctx.outer_steps``), else the ``sync_every`` given here. The one
        place H is read; it is read when a round begins (after each outer step), so a decision effective at
        WAN iteration N switches H for round N at every site alike. H = 1 exchanges every step."""
        decided = getattr(self.ctx, "outer_steps", None)
        if type(decided) is int and decided >= 1:
            return decided
        return self._sync_every

    @property
    def inner_steps_done(self) -> int:
        """Inner steps taken in the current round (0 right after an outer step)."""
        return self._done

    @property
    def round_length(self) -> int:
        """H of the current round (fixed when the round began)."""
        return self._h

    @property
    def anchor(self) -> Sequence[torch.Tensor]:
        """The parameters at the last outer step: identical at every site (read-only)."""
        return tuple(self._anchor)

    @property
    def outer_lr(self) -> float:
        return self._kernel.lr

    @outer_lr.setter
    def outer_lr(self, value: float) -> None:
        self._kernel.lr = value

    def step(self) -> None:
        """One inner step (``inner_optimizer.step()``); at the round's H-th, the outer step too."""
        self.inner.step()
        self._done += 1
        if self._done < self._h:
            self._exchange.local_step()
            return
        self._outer_step()

    def _outer_step(self) -> None:
        """DiLoCo Algorithm 1, lines 8-12: Δ = anchor − θ into ``.grad``, θ ← anchor, then the context's
        step averages Δ over the sites and applies the outer optimizer to θ; the result is the new anchor."""
        with torch.no_grad():
            for p, a in zip(self._params, self._anchor, strict=True):
                p.grad = a - p
                p.copy_(a)
        self.ctx.step()
        with torch.no_grad():
            for p, a in zip(self._params, self._anchor, strict=True):
                p.grad = None
                a.copy_(p)
        self._done = 0
        self._h = self.sync_every()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)

    def _back_to_anchor(self) -> None:
        """``ctx.close()``: the final exchange applies outstanding averages to the anchor, not to the
        unfinished round's local parameters (whose inner steps are dropped, with a warning)."""
        if self._done:
            log.warning(
                "close() after %d of %d inner steps of outer step %d: they are dropped (the parameters go "
                "back to the last outer step's)",
                self._done,
                self._h,
                self.ctx.iteration,
            )
        with torch.no_grad():
            for p, a in zip(self._params, self._anchor, strict=True):
                p.copy_(a)
        self._done = 0

    def close(self) -> None:
        """``ctx.close()``, then the anchor follows the parameters (the outstanding averages applied)."""
        self.ctx.close()
        with torch.no_grad():
            for p, a in zip(self._params, self._anchor, strict=True):
                a.copy_(p)

    # -- checkpoint --------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The outer optimizer's state with the context's (``SparseOptimizer.state_dict()``'s contents:
        momentum, residuals, iteration), the anchor and the inner optimizer's state. Take it at an outer
        step's end after ``close()`` (or at staleness 0), as a SparseOptimizer's."""
        if self._done:
            raise LocalProtocolError(
                f"state_dict() after {self._done} of {self._h} inner steps",
                hint="checkpoint right after an outer step (DiLoCo.inner_steps_done == 0)",
            )
        return {
            "outer": self.ctx.optimizer_state(),
            "anchor": {n: a.detach().clone() for n, a in zip(self._names, self._anchor, strict=True)},
            "inner": self.inner.state_dict(),
            "sync_every": self._sync_every,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` before the first step (``wanrt.init(..., resume_at=...)``, as for a
        SparseOptimizer): the parameters are set to the anchor."""
        anchor = state.get("anchor")
        if not isinstance(anchor, dict) or sorted(anchor) != sorted(self._names):
            raise LocalProtocolError("checkpoint's anchor does not name this model's parameters")
        for n, a in anchor.items():
            p = self._params[self._names.index(n)]
            if not isinstance(a, torch.Tensor) or a.shape != p.shape or a.dtype != p.dtype:
                raise LocalProtocolError(f"checkpoint's anchor {n!r} does not match the parameter", name=n)
        self.ctx.load_optimizer_state(state["outer"])
        self.inner.load_state_dict(state["inner"])
        self._sync_every = _check_h(state.get("sync_every"), "sync_every")
        with torch.no_grad():
            for n, p, a in zip(self._names, self._params, self._anchor, strict=True):
                a.copy_(anchor[n])
                p.copy_(a)
        self._h = self.sync_every()
