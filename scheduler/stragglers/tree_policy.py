"""STAR §IV-D2's latency tree, made from what the gateways measure: which site is the cheapest root, which
sites belong in the lower layers, announced as ``site_costs`` only when the tree's shape would change.

STAR §IV-D2 ("Amortizing communication overhead") places sites with longer latencies in lower layers,
attached to higher-layer nodes over low-latency links. A wanrt site's "latency" for one round is the time
its access link needs to move the round's payload: an interior node's link carries its children's partials
up and the finals down besides its own (for a binary tree 3 payloads each way, the root 2, a leaf 1), so a
site with a slow link must be a leaf. The cost of a site here is ``P / c_s``: ``P`` the median bytes one
tree edge carried per round, ``c_s`` the site's link rate. Both come only from the gateways' telemetry:

* per directed link, ``link.<peer>.busy_bytes`` / ``link.<peer>.busy_s`` (cumulative: the bytes of the
  reported iterations' messages and the time the link had them in flight, from first chunk to
  acknowledgement). A window's ratio is what the link delivered while it was delivering, the
  acknowledgement round trip included — so the latency STAR speaks of is in the cost, not just the rate;
  ``frontier`` (rounds done) turns the window's bytes into bytes per round.
* an edge's rate is the slower of its two directions; a site's **rate bound** ``U_s`` is the best rate of
  its edges (its link carried at least that).

Only the links the running tree uses carry payloads, so a leaf whose only edge goes to a slow parent reads
as slow as its parent. The rate of an edge is set by its slower end; an edge ``(s, t)`` whose ``t`` did
markedly better elsewhere (``U_t ≥ slow_ratio × r``) proves ``s`` slow. A site all of whose edges go to
proven-slow sites at their speed is *unknown* — its own link was never the limit — and is given the best
rate seen (optimistic: if it is slow, the next tree attaches it under a fast parent and proves it).

When to announce (ours, as in :mod:`scheduler.stragglers.mode_policy`: noise must not re-plan the WAN):
a round's time is bounded by its busiest access link, ``max_s deg(s) · P / c_s`` with ``deg`` the site's
tree edges. The tree :func:`~scheduler.stragglers.tree.latency_tree` builds from the costs is announced
when its shape differs from the running one and it lowers that bound by at least ``tree_gain``; two trees
that differ only by noise predict nearly the same bound and never alternate. The running tree is the one
last committed, or before any commit the edges the telemetry shows carrying payloads.

Ring, all-pairs and parent–child have no layers: every core member's link carries the same share, so the
policy is for one-root plans (``base_topology`` tree or star; for a star the root is what costs change).
Sans-IO: ``now`` is an argument.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scheduler.stragglers.tree import latency_tree
from wanrt.protocol.job_settings import (
    MAX_SITE_COSTS_CHARS,
    PlanSettings,
    format_site_costs,
    parse_site_costs,
)

__all__ = ["LatencyTreePolicy", "TreeChoice", "TreeSettings"]

log = logging.getLogger("scheduler.stragglers")

_LINK = "link."
_BYTES = ".busy_bytes"
_BUSY = ".busy_s"
#: Iterations past a new tree's effective iteration before its links are measured: a gateway's frontier
#: runs up to its rounds ``window`` (3) + 2 in flight ahead of rounds still finishing under the old tree.
SETTLE_ROUNDS = 8


@dataclass(frozen=True)
class TreeSettings:
    """The knobs :class:`~scheduler.stragglers.site_config.SiteStragglerConfig` passes down (documented
    there: ``tree_arity``, ``tree_gain``, ``tree_slow_ratio``, ``tree_min_busy_s``, ``tree_max_age_s``)."""

    kind: str = "tree"
    arity: int = 2
    gain: float = 0.2
    slow_ratio: float = 1.5
    min_busy_s: float = 0.5
    max_age_s: float = 120.0


@dataclass(frozen=True)
class TreeChoice:
    """What the last decision saw: the costs, the running and proposed trees' bounds, whether it spoke."""

    at: float
    costs: dict[str, float]
    running_s: float
    proposed_s: float
    parents: dict[str, str | None]
    announced: bool


@dataclass(slots=True)
class _Window:
    bytes0: float
    busy0: float
    rounds0: float
    rate_bps: float | None = None
    bytes_per_round: float | None = None
    at: float = -math.inf


class LatencyTreePolicy:
    """See the module docstring."""

    def __init__(self, sites: Sequence[str], settings: TreeSettings | None = None) -> None:
        self.cfg = settings or TreeSettings()
        self.sites = tuple(sorted(sites))
        self._links: dict[tuple[str, str], _Window] = {}  # (sender, receiver)
        self._frontier: dict[str, float] = {}
        self.running: dict[str, str | None] | None = None  # the committed tree (None: not ours yet)
        self.committed_costs: dict[str, float] | None = None
        self.last: TreeChoice | None = None
        #: windows start afresh at this iteration (a committed tree's); older ones mix two trees' traffic
        self._since = -1.0

    # -- measurements --------------------------------------------------------------------------------

    def observe(self, site: str, metrics: Mapping[str, float], now: float) -> None:
        """One gateway report: close every link window that has ``min_busy_s`` of busy time."""
        if site not in self.sites:
            return
        rounds = metrics.get("frontier")
        if rounds is None or not math.isfinite(rounds):
            return
        self._frontier[site] = rounds
        for key, nbytes in metrics.items():
            if not (key.startswith(_LINK) and key.endswith(_BYTES)):
                continue
            peer = key[len(_LINK) : -len(_BYTES)]
            busy = metrics.get(_LINK + peer + _BUSY)
            if peer not in self.sites or peer == site or busy is None:
                continue
            if not (math.isfinite(nbytes) and math.isfinite(busy)):
                continue
            w = self._links.get((site, peer))
            if w is None or nbytes < w.bytes0 or busy < w.busy0:  # new, or the gateway restarted
                self._links[(site, peer)] = _Window(nbytes, busy, rounds)
                continue
            if w.rounds0 < self._since:  # the window began under the previous tree
                if rounds >= self._since:
                    self._links[(site, peer)] = _Window(nbytes, busy, rounds)
                continue
            d_busy, d_bytes, d_rounds = busy - w.busy0, nbytes - w.bytes0, rounds - w.rounds0
            if d_busy < self.cfg.min_busy_s or d_bytes <= 0 or d_rounds <= 0:
                continue
            w.rate_bps = 8.0 * d_bytes / d_busy
            w.bytes_per_round = d_bytes / d_rounds
            w.at = now
            w.bytes0, w.busy0, w.rounds0 = nbytes, busy, rounds

    def edge_rates(self, now: float) -> dict[tuple[str, str], tuple[float, float]]:
        """Fresh undirected edges (a < b): (rate bit/s = the slower direction, bytes per round)."""
        out: dict[tuple[str, str], tuple[float, float]] = {}
        for (a, b), w in self._links.items():
            if w.rate_bps is None or w.bytes_per_round is None or now - w.at > self.cfg.max_age_s:
                continue
            e = (min(a, b), max(a, b))
            old = out.get(e)
            rate = w.rate_bps if old is None else min(old[0], w.rate_bps)
            per_round = w.bytes_per_round if old is None else max(old[1], w.bytes_per_round)
            out[e] = (rate, per_round)
        return out

    def site_costs(self, now: float) -> dict[str, float] | None:
        """Seconds per round payload of every site (None: some site has no fresh edge yet)."""
        edges = self.edge_rates(now)
        mine: dict[str, list[tuple[str, float]]] = {s: [] for s in self.sites}
        for (a, b), (rate, _) in edges.items():
            mine[a].append((b, rate))
            mine[b].append((a, rate))
        if any(not v for v in mine.values()):
            return None
        bound = {s: max(r for _, r in v) for s, v in mine.items()}
        ratio = self.cfg.slow_ratio
        proven = {s for s, v in mine.items() if any(bound[t] >= ratio * r for t, r in v)}
        best = max(bound.values())
        cap = {}
        for s, v in mine.items():
            explained = s not in proven and all(t in proven and r <= ratio * bound[t] for t, r in v)
            cap[s] = best if explained else bound[s]
        payload = statistics.median(p for _, p in edges.values())
        return {s: payload * 8.0 / cap[s] for s in self.sites}

    def _measured_tree(self, now: float) -> frozenset[tuple[str, str]] | None:
        """The edges carrying payloads now (None: they do not form one spanning tree)."""
        edges = frozenset(self.edge_rates(now))
        if len(edges) != len(self.sites) - 1:
            return None
        return edges

    # -- decisions -----------------------------------------------------------------------------------

    def decide(self, now: float) -> PlanSettings | None:
        """A plan with ``site_costs`` when the measured costs call for another tree shape, else None."""
        costs = self.site_costs(now)
        if costs is None or len(self.sites) < 2:
            return None
        running = _edges(self.running) if self.running is not None else self._measured_tree(now)
        if running is None:
            return None
        text = format_site_costs(costs)
        if len(text) > MAX_SITE_COSTS_CHARS:  # a job too big for one Announce string keeps its tree
            return None
        rounded = parse_site_costs(text)  # what every gateway will build from
        parents = self._tree(rounded)
        running_s = _bound(_degrees(self.sites, running), costs)
        proposed = _edges(parents)
        proposed_s = _bound(_degrees(self.sites, proposed), costs)
        same = proposed == running
        announce = not same and proposed_s < running_s * (1.0 - self.cfg.gain)
        self.last = TreeChoice(now, dict(rounded), running_s, proposed_s, parents, announce)
        if not announce:
            return None
        root = next(s for s, p in parents.items() if p is None)
        log.info(
            "latency tree (STAR §IV-D2): root %s, busiest link %.3g → %.3g s per round; costs %s",
            root,
            running_s,
            proposed_s,
            text,
        )
        return PlanSettings(site_costs=rounded)

    def _tree(self, costs: Mapping[str, float]) -> dict[str, str | None]:
        """The tree the gateways build from ``costs`` (gateways.rounds.topology fills levels alike)."""
        if self.cfg.kind == "star":
            root = min(self.sites, key=lambda s: (costs[s], s))
            return {s: (None if s == root else root) for s in self.sites}
        return latency_tree(costs, self.cfg.arity)

    def committed(self, values: PlanSettings, effective_iteration: int = -1) -> None:
        """A decision carrying ``site_costs`` runs everywhere from ``effective_iteration`` (the scheduler's
        or an operator's). The measurements start afresh there: a window spanning the switch mixes the
        old tree's traffic (a link draining its last messages reads slow) with the new one's."""
        if values.site_costs is None:
            return
        costs = dict(values.site_costs)
        if self.committed_costs is not None and costs == self.committed_costs:
            return  # carried on unchanged by a later decision: the same tree, keep measuring
        self._since = float(effective_iteration + SETTLE_ROUNDS)
        for w in self._links.values():
            w.rate_bps, w.bytes_per_round = None, None
        if set(costs) != set(self.sites):
            self.running, self.committed_costs = None, None  # partial costs: learn the tree from traffic
            return
        self.committed_costs = costs
        self.running = self._tree(costs)


def _edges(parents: Mapping[str, str | None]) -> frozenset[tuple[str, str]]:
    return frozenset((min(c, p), max(c, p)) for c, p in parents.items() if p is not None)


def _degrees(sites: Sequence[str], edges: frozenset[tuple[str, str]]) -> dict[str, int]:
    deg = dict.fromkeys(sites, 0)
    for a, b in edges:
        deg[a] += 1
        deg[b] += 1
    return deg


def _bound(deg: Mapping[str, int], costs: Mapping[str, float]) -> float:
    """The busiest access link's seconds per round: each tree edge moves one payload over both ends."""
    return max(deg[s] * costs[s] for s in deg)
