"""STAR §IV-D2 "amortizing communication overhead": a tree with the slow sites in the low layers.

The root (the PS, or the proxy/parent in all-reduce) aggregates; sites with longer latencies go to lower
layers and attach to a higher-layer site over a low-latency link; each node adds its children's gradients
to its own and forwards the sum up. Layers are filled in order of each site's cost to the root (cheapest
first, at most ``arity`` children per node, so layer L holds up to arity^L sites), and every site of a
layer picks, among the previous layer's nodes with a free slot, the one with the cheapest link to it
(pairwise costs when known, else the parent's own cost). The decision carries the costs too, so the
gateways can rebuild the same plan with their own builder.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from wanrt.errors import ConfigError

__all__ = ["latency_tree", "tree_depths"]


def latency_tree(
    costs: Mapping[str, float],
    arity: int = 2,
    link_costs: Mapping[tuple[str, str], float] | None = None,
    root: str | None = None,
) -> dict[str, str | None]:
    """Parent of every site (None for the root); ``costs`` = each site's latency to the root."""
    if not costs:
        raise ConfigError("at least one site is needed", key="costs")
    if arity < 1:
        raise ConfigError("arity must be ≥ 1", key="arity", value=arity)
    for s, c in costs.items():
        if not (math.isfinite(c) and c >= 0):
            raise ConfigError("site costs must be finite and ≥ 0", key="costs", value=(s, c))
    order = sorted(costs, key=lambda s: (costs[s], s))
    if root is not None:
        if root not in costs:
            raise ConfigError("root must be one of the sites", key="root", value=root)
        order.remove(root)
        order.insert(0, root)
    links = link_costs or {}

    def link(a: str, b: str) -> float:
        if (a, b) in links:
            return links[(a, b)]
        if (b, a) in links:
            return links[(b, a)]
        return costs[a]  # unknown pair: the parent's own cost stands in

    parents: dict[str, str | None] = {order[0]: None}
    layer = [order[0]]
    i = 1
    while i < len(order):
        nxt = order[i : i + len(layer) * arity]
        free = dict.fromkeys(layer, arity)
        for site in nxt:
            parent = min((p for p in layer if free[p] > 0), key=lambda p: (link(p, site), p))
            free[parent] -= 1
            parents[site] = parent
        layer = nxt
        i += len(nxt)
    return parents


def tree_depths(parents: Mapping[str, str | None]) -> dict[str, int]:
    """Depth of every node (root 0)."""
    depth: dict[str, int] = {}
    for start in parents:
        path: list[str] = []
        s: str | None = start
        while s is not None and s not in depth:
            if len(path) > len(parents):
                raise ConfigError("parents contain a cycle", key="parents")
            path.append(s)
            s = parents[s]
        base = -1 if s is None else depth[s]
        for k, node in enumerate(reversed(path)):
            depth[node] = base + 1 + k
    return depth
