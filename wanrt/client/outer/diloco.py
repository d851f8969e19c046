"""``wanrt.DiLoCo``: H local steps with any torch optimizer, then one exchange of the pseudo-gradient.

DiLoCo (Douillard et al., arXiv 2311.08105, Algorithm 1 and §3): every worker starts a round from the
shared parameters θ^{t−1} (the *anchor*), takes H inner steps with its own inner optimizer (AdamW in the
paper), and then the workers average the *outer gradient* Δ = θ^{t−1} − θ_i^t; an outer optimizer (Nesterov
momentum SGD, lr 0.7, momentum 0.9 in §3) applies the average to the anchor, and the result is the next
round's start at every worker.

How it sits on wanrt: the outer step *is* one WAN iteration of the existing machinery. The wrapper binds
the model to the context with the outer optimizer as the context's sparse kernel optimizer
(``momentum`` kind with Nesterov, or ``sgd`` without momentum); at the outer step it writes Δ into every
parameter's ``.grad``, swaps the model's tensors for the anchors and calls the context's step. So the
pseudo-gradient travels exactly as a gradient does: reduced to the site's mean inside the site, compressed
by the leader (top-k / threshold blocks, the handshake's wire dtype incl. int8/int4/int2) with error
feedback — what a round does not send stays in the residual and is added to the next round's Δ, as
SparseLoCo does with its pseudo-gradients — summed by the gateways, and applied to the anchors at every
rank of every site by the same deterministic kernel, in the same order: the anchors (the job's
parameters) are bit-identical at every site after each outer step. Kill/restart, resync, checkpoints and
the scheduler's settings are those of the context: a replacement trainer fetches the job's parameters
*and* the outer optimizer's momentum (the kernel's state) from another site.

Streaming DiLoCo (Douillard et al., arXiv 2501.18512) is the same class with ``fragments`` P > 1: an
exchange every H/P inner steps carries one fragment (wanrt/client/outer/fragments.py, §2.2), and with
``ClientConfig.staleness`` s ≥ 1 each exchange lands s outer steps later, overlapped with the inner steps
in between and mixed into the local copy with ``mixing`` α (§2.3); see :meth:`DiLoCo._outer_step`.

What differs from the papers, and why:

* the outer momentum is the kernel's *lazy* momentum (wanrt/kernels/sparse_optim.py): with a sparse Δ it
  moves only the blocks that the round's average touched (StellaTrain §3.1); with ``density=1`` it is
  exactly ``torch.optim.SGD(momentum, nesterov=True)``;
* an exchange that lands after its fragment's next exchange (s ≥ P, e.g. DiLoCo with s = 1; the paper
  takes τ < H) keeps the in-flight progress in the local copy instead of mixing (see ``_outer_step``);
* ranks of one site each take their own inner steps (more DiLoCo workers, averaged inside the site first);
* ``ClientConfig.local_steps`` (gradient accumulation) does not apply: the inner loop is the user's, and
  the pushed pseudo-gradient is never divided by it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from wanrt.client.context import Context
from wanrt.client.optimizer import ParamsArg, named_trainable
from wanrt.client.outer.fragments import Landings, fragment_layers
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
    ``ctx.iteration`` counts outer steps: one gateway round per outer step. ``fragments`` P > 1 is
    Streaming DiLoCo (an exchange of one fragment every H/P calls), ``mixing`` its α.

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
        fragments: int = 1,
        mixing: float = 0.0,
    ) -> None:
        self._sync_every = _check_h(sync_every, "sync_every")
        self._fragments = _check_h(fragments, "fragments")
        if not 0.0 <= mixing < 1.0:
            raise ConfigError(f"mixing (α) must be in [0, 1), got {mixing!r}", key="mixing")
        self.mixing = mixing
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
        self._landings = Landings()
        self._done = 0  # inner steps of the current round
        self._begin_round()
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

    def fragment_count(self) -> int:
        """P, the fragments of the model synchronised in turn (Streaming DiLoCo §2.2; 1 = all at once):
        the job's decided ``fragments`` when the scheduler sets one (``ctx.fragments``), else the
        ``fragments`` given here. Read when a round begins, as :meth:`sync_every`."""
        decided = getattr(self.ctx, "fragments", None)
        if type(decided) is int and decided >= 1:
            return decided
        return self._fragments

    def _begin_round(self) -> None:
        self._h = self.sync_every()
        self._p = min(self.fragment_count(), len(self._params))
        # one WAN iteration per H/P inner steps: each fragment every H inner steps (Streaming DiLoCo §2.2)
        self._round = max(1, self._h // self._p)

    @property
    def inner_steps_done(self) -> int:
        """Inner steps taken in the current round (0 right after an outer step)."""
        return self._done

    @property
    def round_length(self) -> int:
        """Inner steps of the current round, fixed when it began: H, or H/P with P fragments."""
        return self._round

    @property
    def fragments(self) -> int:
        """P of the current round."""
        return self._p

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
        if self._done < self._round:
            self._exchange.local_step()
            return
        self._outer_step()

    def _outer_step(self) -> None:
        """DiLoCo Algorithm 1, lines 8-12, on the round's fragment (all layers when P = 1).

        Δ = anchor − θ goes into ``.grad`` for the fragment's layers (the others push nothing), the model's
        tensors are swapped for the anchors, and the context's step averages Δ over the sites and applies
        the outer optimizer to the anchors — the same updates at every site, so the anchors are
        bit-identical after it. Then the local tensors come back and the layers whose update landed take
        it. Two cases, by when an exchange lands (``staleness`` s outer steps later, τ = s·H/P):

        * before the fragment's next exchange (s < P; Streaming DiLoCo §2.3, and DiLoCo itself at s = 0):
          θ ← α·θ + (1 − α)·anchor, α = ``mixing`` (0: DiLoCo's θ ← anchor);
        * after it (s ≥ P, e.g. P = 1 with s = 1; outside the paper, which takes τ < H): the local copy
          still holds the progress an earlier push carries, so the next Δ leaves it out (Δ = anchor +
          progress in flight − θ) and the landing swaps it for the job's update (θ += anchor_after −
          anchor_before − progress): no progress is counted twice, none is dropped, and the local copy
          never trains from behind its own progress.
        """
        it = self.ctx.iteration
        n = len(self._params)
        layers = fragment_layers(it, n, self._p)
        upto = self._exchange.apply_upto(it, self._exchange.bound(self.ctx.config.staleness), final=False)
        keep = it - upto >= self._p  # lands after the fragment's next exchange
        moved: dict[int, torch.Tensor] = {}
        resyncs = self.ctx.resyncs
        with torch.no_grad():
            local: list[torch.Tensor] = []
            for i, (p, a) in enumerate(zip(self._params, self._anchor, strict=True)):
                if i in layers:
                    delta = a - p
                    for progress in self._landings.in_flight(i):
                        delta.add_(progress)
                    if keep:
                        moved[i] = delta.neg()
                    p.grad = delta
                else:
                    p.grad = torch.zeros_like(p)
                local.append(p.data)
                p.data = a  # the kernel updates the anchor in place
            self._landings.pushed(it, layers, moved if keep else None)
            landing = self._landings.landed(upto)  # what this step applies (OuterExchange.apply_upto)
            before = {i: self._anchor[i].clone() for i, m in landing.items() if m is not None}
        self._exchange.silent = frozenset(range(n)) - layers
        try:
            self.ctx.step()
        finally:
            self._exchange.silent = frozenset()
            with torch.no_grad():
                for p, mine in zip(self._params, local, strict=True):
                    p.grad = None
                    p.data = mine
        with torch.no_grad():
            if self.ctx.resyncs != resyncs:  # the job's parameters were installed (in the anchors)
                self._landings.clear()
                for mine, a in zip(local, self._anchor, strict=True):
                    mine.copy_(a)
            else:
                for i, kept in sorted(landing.items()):
                    mine, a = local[i], self._anchor[i]
                    if kept is not None:
                        mine.add_(a - before[i])
                        for progress in kept:
                            mine.sub_(progress)
                    elif self.mixing == 0.0:
                        mine.copy_(a)
                    else:
                        mine.mul_(self.mixing).add_(a, alpha=1.0 - self.mixing)
        self._done = 0
        self._begin_round()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)

    def _back_to_anchor(self) -> None:
        """``ctx.close()``: the final exchange applies outstanding averages to the anchor, not to the
        local parameters (an unfinished round's inner steps are dropped, with a warning); the model keeps
        the anchors from then on."""
        if self._done:
            log.warning(
                "close() after %d of %d inner steps of outer step %d: they are dropped (the parameters go "
                "back to the last outer step's)",
                self._done,
                self._round,
                self.ctx.iteration,
            )
        with torch.no_grad():
            for p, a in zip(self._params, self._anchor, strict=True):
                p.data = a
        self._landings.clear()
        self._done = 0

    def close(self) -> None:
        """``ctx.close()``: the outstanding averages applied, the model holds the job's parameters."""
        self.ctx.close()

    # -- checkpoint --------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The outer optimizer's state with the context's (``SparseOptimizer.state_dict()``'s contents:
        momentum, residuals, iteration), the anchor and the inner optimizer's state. Take it at an outer
        step's end after ``close()`` (or at staleness 0), as a SparseOptimizer's."""
        if self._done:
            raise LocalProtocolError(
                f"state_dict() after {self._done} of {self._round} inner steps",
                hint="checkpoint right after an outer step (DiLoCo.inner_steps_done == 0)",
            )
        return {
            "outer": self.ctx.optimizer_state(),
            "anchor": {n: a.detach().clone() for n, a in zip(self._names, self._anchor, strict=True)},
            "inner": self.inner.state_dict(),
            "sync_every": self._sync_every,
            "fragments": self._fragments,
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
        self._fragments = _check_h(state.get("fragments", 1), "fragments")
        with torch.no_grad():
            for n, p, a in zip(self._names, self._params, self._anchor, strict=True):
                a.copy_(anchor[n])
                p.copy_(a)
        self._landings.clear()
        self._begin_round()
