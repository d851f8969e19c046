"""Outer-loop synchronisation: the exchange every H inner steps instead of every step.

* :class:`~wanrt.client.outer.diloco.DiLoCo` (arXiv 2311.08105): each site takes H steps with any torch
  optimizer, then the sites average the pseudo-gradient (anchor − parameters) through the gateways,
  compressed like any payload, and every site applies it to the anchor with the same outer optimizer.
* :class:`~wanrt.client.outer.exchange.OuterExchange`: the context's side of it (inner steps that exchange
  nothing, the push of ``.grad`` as the loop set it).

``DiLoCo`` resolves lazily: the context imports this package's ``exchange`` module, and ``diloco`` imports
the context. See docs/outer_loop.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wanrt.client.outer.diloco import DiLoCo

__all__ = ["DiLoCo"]


def __getattr__(name: str) -> Any:
    if name == "DiLoCo":
        return importlib.import_module("wanrt.client.outer.diloco").DiLoCo
    raise AttributeError(f"module 'wanrt.client.outer' has no attribute {name!r}")
