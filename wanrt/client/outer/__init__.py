"""Outer-loop synchronisation: the exchange every H inner steps instead of every step.

* :class:`~wanrt.client.outer.diloco.DiLoCo` (arXiv 2311.08105): each site takes H steps with any torch
  optimizer, then the sites average the pseudo-gradient (anchor − parameters) through the gateways,
  compressed like any payload, and every site applies it to the anchor with the same outer optimizer.

See docs/outer_loop.md.
"""

from __future__ import annotations

from wanrt.client.outer.diloco import DiLoCo

__all__ = ["DiLoCo"]
