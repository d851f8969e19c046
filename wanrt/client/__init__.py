"""The trainer client API: a few lines added to an ordinary (torchrun-launched) PyTorch training loop.

::

    ctx = wanrt.init(gateway="unix:///run/wanrt/a.sock", secret_file="job.key", site="a", job="j")
    opt = wanrt.SparseOptimizer(model.named_parameters(), "adam", lr=1e-3, ctx=ctx)
    for x, y in data:
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    ctx.close()

Public names (also on :mod:`wanrt`: ``init``, ``SparseOptimizer``, ``DiLoCo``, ``Context``, ``ClientConfig``):

* :func:`init` (:mod:`~wanrt.client.bootstrap`): this process's :class:`Context`; call on every rank.
* :class:`SparseOptimizer` (:mod:`~wanrt.client.optimizer`): swapped in for ``torch.optim.Adam`` & co.
* :class:`DiLoCo` (:mod:`~wanrt.client.outer`): an outer loop around any torch optimizer, exchanging the
  pseudo-gradient every H steps (arXiv 2311.08105; docs/outer_loop.md).
* :class:`Context` (:mod:`~wanrt.client.context`): the per-process handle; ``close()`` at the end.
* :class:`ClientConfig` (:mod:`~wanrt.client.config`): density, wire dtype, staleness, timeouts;
  ``ClientConfig.dense_baseline()`` is what DDP would send.
* The mistakes a trainer can make, each with a hint (:mod:`~wanrt.client.errors`):
  :class:`GatewayUnreachable`, :class:`ModelMismatch`, :class:`DistributedNotInitialized`,
  :class:`StepWithoutBackward`, :class:`LeaderFailed`, :class:`RunRefused`; and a warning at exit for a
  context never closed, :class:`UnclosedContextWarning` (:mod:`~wanrt.client.unclosed`).

Internals, by who runs them: :mod:`wanrt.client.site` (among the ranks of a site), :mod:`wanrt.client.leader`
(the site leader only), :mod:`wanrt.client.link` (the leader's connection to its gateway).

The names resolve lazily, so ``import wanrt.client.config`` (or ``import wanrt``) does not import torch;
the first use of ``init`` or ``SparseOptimizer`` does. See docs/client.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wanrt.client.bootstrap import init
    from wanrt.client.config import ClientConfig
    from wanrt.client.context import Context
    from wanrt.client.errors import (
        DistributedNotInitialized,
        GatewayUnreachable,
        LeaderFailed,
        ModelMismatch,
        RunRefused,
        StepWithoutBackward,
    )
    from wanrt.client.optimizer import SparseOptimizer
    from wanrt.client.outer.diloco import DiLoCo
    from wanrt.client.unclosed import UnclosedContextWarning

#: public name -> module that defines it
EXPORTS: dict[str, str] = {
    "ClientConfig": "wanrt.client.config",
    "Context": "wanrt.client.context",
    "DiLoCo": "wanrt.client.outer.diloco",
    "DistributedNotInitialized": "wanrt.client.errors",
    "GatewayUnreachable": "wanrt.client.errors",
    "LeaderFailed": "wanrt.client.errors",
    "ModelMismatch": "wanrt.client.errors",
    "RunRefused": "wanrt.client.errors",
    "SparseOptimizer": "wanrt.client.optimizer",
    "StepWithoutBackward": "wanrt.client.errors",
    "UnclosedContextWarning": "wanrt.client.unclosed",
    "init": "wanrt.client.bootstrap",
}

__all__ = [
    "ClientConfig",
    "Context",
    "DiLoCo",
    "DistributedNotInitialized",
    "GatewayUnreachable",
    "LeaderFailed",
    "ModelMismatch",
    "RunRefused",
    "SparseOptimizer",
    "StepWithoutBackward",
    "UnclosedContextWarning",
    "init",
]


def __getattr__(name: str) -> Any:
    module = EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'wanrt.client' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(EXPORTS))
