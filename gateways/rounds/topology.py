"""Who sends what to whom in a WAN round: star, k-ary tree, ring, all-pairs and parent–child plans as plain
frozen data.

Every plan has the same shape, so one round engine runs them all:

* a **core** — the sites that finish the reduction: one root (star, tree) or a group of sites that run a
  sparse reduce-scatter + all-gather among themselves (ring, all-pairs, parent–child);
* **attachments** — every other site has a parent; it sends the partial aggregate of its subtree up and
  receives the final result back down.

Why these five (the source papers are listed in docs/architecture.md):

* *star* — one root aggregates and broadcasts; the simplest plan, best for a handful of well-connected sites.
* *tree* — STAR §IV-D2 "Amortizing communication overhead": sites with longer latencies are placed in lower
  layers and connected to higher-layer nodes with low-latency links; each node aggregates its children's
  gradients with its own and forwards the sum upward, the root's result goes back down. Built here from
  per-site cost estimates (cheapest site = root, levels filled in cost order, at most ``arity`` children),
  optionally matching each level to parents by pairwise link cost.
* *ring* — reduce-scatter + all-gather over sparse payloads: the block-index space is split into N
  contiguous segments, so every link carries about 2(N-1)/N of a payload instead of the root's N-fold load.
* *allpairs* — the "butterfly" reduce-scatter + all-gather: the same N segments as the ring, but each member
  sends segment g straight to its owner (member g) and each owner sends its finished segment straight to
  every other member, all links at once. Every site sends the ring's 2(N-1)/N of a payload, but over its
  N-1 links in parallel instead of one link at a time, and a round takes 2 message latencies instead of
  2(N-1) — the right plan when every pair of sites has its own WAN path (a full mesh of site links).
  Stragglers attach to core members exactly as under parent–child.
* *parent–child* — STAR §IV-B (all-reduce architecture): straggling sites are removed from the ring and
  attached to a well-connected ring member (their parent), which waits ``t_w`` after its own computation
  for them before joining the ring; STAR §IV-D1 balances parents by letting each child pick the ring
  member with the fewest children (then the best link). Stragglers given to a star or a tree are attached
  the same way, as leaves whose parent waits only ``t_w``.

Plans are deterministic functions of (:class:`PlanSpec`, member set): every gateway that computes the plan
from the same inputs gets the same plan and the same :attr:`Plan.plan_id`, so a plan can be recomputed
locally when a site is lost or rejoins, and messages carry ``plan_id`` to detect disagreement.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from wanrt.config import check

__all__ = [
    "TOPOLOGY_KINDS",
    "Plan",
    "PlanSpec",
    "TopologyKind",
    "build_plan",
]

TopologyKind: TypeAlias = Literal["star", "tree", "ring", "parent_child", "allpairs"]
TOPOLOGY_KINDS: tuple[TopologyKind, ...] = ("star", "tree", "ring", "parent_child", "allpairs")


@dataclass(frozen=True)
class PlanSpec:
    """The inputs of a plan besides its members; canonicalised so equal inputs compare (and hash) equal.

    ``costs`` are per-site link cost estimates (larger = slower or farther, e.g. seconds to ship one
    payload to the others); a site without an estimate counts as the most expensive. ``link_costs`` are
    optional pairwise (symmetric) costs used to pick parents. ``stragglers`` are detached and attached to a
    parent that waits ``t_w`` for them: ``t_w_s`` when given (a scheduler's STAR Eq. 3 choice, in force for
    the iterations this spec governs), else the round config's ``t_w_s``.
    """

    kind: TopologyKind = "tree"
    arity: int = 2
    costs: tuple[tuple[str, float], ...] = ()
    link_costs: tuple[tuple[str, str, float], ...] = ()
    stragglers: tuple[str, ...] = ()
    root: str | None = None
    t_w_s: float | None = None
    #: STAR §IV-B static x-order: a root finishes a round once this many sites contributed (None/0: all,
    #: or the round deadline); the late ones are folded into a later round as late contributions
    x_order: int | None = None
    _cost: dict[str, float] = field(init=False, repr=False, compare=False, hash=False)
    _link: dict[tuple[str, str], float] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        check(self.kind in TOPOLOGY_KINDS, "kind", self.kind, f"must be one of {TOPOLOGY_KINDS}")
        check(isinstance(self.arity, int) and 1 <= self.arity <= 1024, "arity", self.arity, "1..1024")
        tw = self.t_w_s
        check(tw is None or (not math.isnan(tw) and 0 <= tw <= 3600), "t_w_s", tw, "None or 0 <= s <= 3600")
        x = self.x_order
        check(x is None or (type(x) is int and 0 <= x <= 1 << 16), "x_order", x, "None or a site count")
        costs = tuple(sorted((str(s), float(c)) for s, c in self.costs))
        for s, c in costs:
            check(not math.isnan(c) and c >= 0, "costs", (s, c), "costs must be >= 0 and not NaN")
        check(len({s for s, _ in costs}) == len(costs), "costs", costs, "one cost per site")
        links: dict[tuple[str, str], float] = {}
        for a, b, c in self.link_costs:
            check(not math.isnan(c) and c >= 0, "link_costs", (a, b, c), "costs must be >= 0 and not NaN")
            check(a != b, "link_costs", (a, b, c), "a link joins two different sites")
            links[(min(a, b), max(a, b))] = float(c)
        object.__setattr__(self, "costs", costs)
        object.__setattr__(self, "link_costs", tuple(sorted((a, b, c) for (a, b), c in links.items())))
        object.__setattr__(self, "stragglers", tuple(sorted(set(self.stragglers))))
        object.__setattr__(self, "_cost", dict(costs))
        object.__setattr__(self, "_link", links)

    @classmethod
    def make(
        cls,
        kind: TopologyKind = "tree",
        *,
        arity: int = 2,
        costs: Mapping[str, float] | None = None,
        link_costs: Mapping[tuple[str, str], float] | None = None,
        stragglers: Iterable[str] = (),
        root: str | None = None,
        t_w_s: float | None = None,
        x_order: int | None = None,
    ) -> PlanSpec:
        """Build a spec from mappings (the natural form for a scheduler's estimates)."""
        return cls(
            kind,
            arity,
            tuple((costs or {}).items()),
            tuple((a, b, c) for (a, b), c in (link_costs or {}).items()),
            tuple(stragglers),
            root,
            None if t_w_s is None else float(t_w_s),
            x_order or None,
        )

    def cost(self, site: str) -> float:
        return self._cost.get(site, math.inf)

    def link(self, a: str, b: str) -> float:
        """Pairwise cost; without an estimate, the worse of the two sites' own costs."""
        c = self._link.get((min(a, b), max(a, b)))
        return c if c is not None else max(self.cost(a), self.cost(b))


@dataclass(frozen=True)
class Plan:
    """One round's communication plan. Build with :func:`build_plan`; fields are canonical and sorted.

    ``core`` is the ring order (a single root for star and tree; for all-pairs, member ``g`` owns segment
    ``g`` and sums are taken in this order); ``parents`` lists (child, parent) for every
    member outside the core; ``waits_tw`` are the children whose parent waits only ``t_w`` for them.
    """

    spec: PlanSpec
    members: tuple[str, ...]
    core: tuple[str, ...]
    parents: tuple[tuple[str, str], ...]
    waits_tw: frozenset[str]
    plan_id: int = field(init=False)
    _parent: dict[str, str] = field(init=False, repr=False, compare=False)
    _children: dict[str, tuple[str, ...]] = field(init=False, repr=False, compare=False)
    _height: dict[str, int] = field(init=False, repr=False, compare=False)
    _pos: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        members = tuple(sorted(set(self.members)))
        object.__setattr__(self, "members", members)
        object.__setattr__(self, "parents", tuple(sorted(self.parents)))
        mset = set(members)
        check(len(members) >= 1, "members", members, "a plan needs at least one site")
        check(len(self.core) >= 1 and len(set(self.core)) == len(self.core), "core", self.core, "distinct")
        check(set(self.core) <= mset, "core", self.core, "core sites must be members")
        parent = dict(self.parents)
        check(len(parent) == len(self.parents), "parents", self.parents, "one parent per child")
        check(
            set(parent) == mset - set(self.core),
            "parents",
            self.parents,
            "every non-core member needs a parent",
        )
        check(set(parent.values()) <= mset, "parents", self.parents, "parents must be members")
        check(set(self.waits_tw) <= set(parent), "waits_tw", sorted(self.waits_tw), "must be attached sites")
        children: dict[str, list[str]] = {s: [] for s in members}
        for c, p in sorted(parent.items()):
            children[p].append(c)
        # every member must reach the core without a cycle; heights computed bottom-up
        depth: dict[str, int] = {s: 0 for s in self.core}
        for s in members:
            path = []
            cur = s
            while cur not in depth:
                path.append(cur)
                cur = parent[cur]
                check(len(path) <= len(members), "parents", self.parents, "cycle in the parent links")
            for k, node in enumerate(reversed(path)):
                depth[node] = depth[cur] + k + 1
        height: dict[str, int] = {}
        for s in sorted(members, key=lambda x: -depth[x]):
            height[s] = 1 + max((height[c] for c in children[s]), default=-1)
        digest = hashlib.blake2b(
            repr((self.spec.kind, members, self.core, self.parents, sorted(self.waits_tw))).encode(),
            digest_size=8,
        ).digest()
        object.__setattr__(self, "plan_id", int.from_bytes(digest, "big") >> 1)
        object.__setattr__(self, "_parent", parent)
        object.__setattr__(self, "_children", {s: tuple(v) for s, v in children.items()})
        object.__setattr__(self, "_height", height)
        object.__setattr__(self, "_pos", {s: i for i, s in enumerate(self.core)})

    # --- queries used by the round engine -------------------------------------------------------------
    def parent_of(self, site: str) -> str | None:
        return self._parent.get(site)

    def children_of(self, site: str) -> tuple[str, ...]:
        return self._children.get(site, ())

    def height_of(self, site: str) -> int:
        """0 for a leaf, 1 + the tallest child's height otherwise; parents wait longer for taller subtrees."""
        return self._height.get(site, 0)

    def in_core(self, site: str) -> bool:
        return site in self._pos

    @property
    def all_pairs(self) -> bool:
        """The core runs the all-pairs exchange (every member talks to every other) instead of a ring."""
        return self.spec.kind == "allpairs"

    def ring_position(self, site: str) -> int:
        return self._pos[site]

    def ring_next(self, site: str) -> str:
        return self.core[(self._pos[site] + 1) % len(self.core)]

    def ring_prev(self, site: str) -> str:
        return self.core[(self._pos[site] - 1) % len(self.core)]

    def neighbours(self, site: str) -> tuple[str, ...]:
        """Every site this one exchanges messages with under the plan."""
        out = set(self.children_of(site))
        p = self.parent_of(site)
        if p is not None:
            out.add(p)
        if site in self._pos and len(self.core) > 1:
            if self.all_pairs:
                out.update(self.core)
            else:
                out.update((self.ring_next(site), self.ring_prev(site)))
        out.discard(site)
        return tuple(sorted(out))

    def subtree(self, site: str) -> tuple[str, ...]:
        out = [site]
        i = 0
        while i < len(out):
            out.extend(self.children_of(out[i]))
            i += 1
        return tuple(sorted(out))


def _ring_order(spec: PlanSpec, sites: list[str]) -> tuple[str, ...]:
    """Sites by name; with pairwise costs, a nearest-neighbour tour from the first name instead."""
    names = sorted(sites)
    if not spec.link_costs or len(names) <= 2:
        return tuple(names)
    tour = [names[0]]
    left = set(names[1:])
    while left:
        here = tour[-1]
        nxt = min(left, key=lambda s: (spec.link(here, s), s))
        tour.append(nxt)
        left.remove(nxt)
    return tuple(tour)


def _tree_parents(spec: PlanSpec, order: list[str]) -> dict[str, str]:
    """Fill levels in cost order (cheapest first), at most ``arity`` children per node (STAR §IV-D2)."""
    parents: dict[str, str] = {}
    level = [order[0]]
    rest = order[1:]
    while rest:
        nxt = rest[: len(level) * spec.arity]
        rest = rest[len(nxt) :]
        load = dict.fromkeys(level, 0)
        if spec.link_costs:
            # each newcomer (cheapest first) takes the free upper node with the best link to it
            for s in nxt:
                p = min((q for q in level if load[q] < spec.arity), key=lambda q: (spec.link(s, q), q))
                parents[s] = p
                load[p] += 1
        else:
            for k, s in enumerate(nxt):
                parents[s] = level[k // spec.arity]
        level = nxt
    return parents


def build_plan(spec: PlanSpec, members: Iterable[str]) -> Plan:
    """The plan of ``spec`` over ``members`` (deterministic; see the module docstring)."""
    mset = sorted(set(members))
    check(len(mset) >= 1, "members", mset, "a plan needs at least one site")
    order = sorted(mset, key=lambda s: (spec.cost(s), s))
    stragglers = [s for s in order if s in set(spec.stragglers)]
    normal = [s for s in order if s not in set(spec.stragglers)]
    if not normal:  # everyone straggles: nobody to wait for, run the plain topology
        normal, stragglers = order, []
    parents: dict[str, str] = {}
    if spec.kind in ("star", "tree"):
        root = spec.root if spec.root in normal else normal[0]
        normal = [root] + [s for s in normal if s != root]
        core: tuple[str, ...] = (root,)
        if spec.kind == "star":
            parents.update({s: root for s in normal[1:]})
        else:
            parents.update(_tree_parents(spec, normal))
    elif spec.kind == "allpairs":
        core = tuple(sorted(normal))  # every pair talks anyway: names fix segment owners and sum order
    else:
        core = _ring_order(spec, normal)
    if stragglers:
        hosts = list(normal) if spec.kind == "tree" else list(core)
        load = {h: sum(1 for p in parents.values() if p == h) for h in hosts}
        # the worst straggler chooses first; each picks the host with fewest children, then the best link
        for s in sorted(stragglers, key=lambda x: (-spec.cost(x), x)):
            h = min(hosts, key=lambda q: (load[q], spec.link(s, q), q))
            parents[s] = h
            load[h] += 1
    return Plan(spec, tuple(mset), core, tuple(parents.items()), frozenset(stragglers))
