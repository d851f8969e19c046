"""How long a node of a round waits for its contributions, and when it may go on without the late ones.

STAR §IV-B. A child gets ``round_deadline_s`` per level of its subtree's height, counted from the round's
opening here; a straggler attached under parent–child (``waits_tw``) gets only ``t_w`` after the node's own
push ("a parent waits for a certain time t_w after its computation"; the scheduler's Eq. 3 may set ``t_w``
per plan); with static x-order a root goes on once the first x sites contributed. Whatever the deadlines,
a root proceeds without late children only once a quorum of the job's sites contributed (x-order with
x = quorum), so a root cut off from the others does not finish rounds with its own push alone.

The engine asks :meth:`GatherRule.deadline` and gathers when it says "now"; this class reads a round and
decides nothing else. Sans-IO: ``now`` is given.
"""

from __future__ import annotations

import math

from gateways.rounds.config import RoundConfig
from gateways.rounds.state import Carry, OpenRound
from gateways.rounds.topology import Plan

__all__ = ["GatherRule"]


class GatherRule:
    """The gather deadlines of gateway ``site``; ``quorum`` sites must contribute to a round's result."""

    def __init__(self, site: str, config: RoundConfig, quorum: int) -> None:
        self.site = site
        self.config = config
        self.quorum = quorum

    def has_quorum(self, plan: Plan) -> bool:
        return len(plan.members) >= self.quorum

    def deadline(self, r: OpenRound, now: float, carry: Carry | None, presending: bool) -> float | None:
        """``None`` if the node may proceed now, else the earliest time something it waits for expires
        (``math.inf``: nothing expires, it waits for more contributions). ``carry`` is the layer's carry,
        ``presending``: slices of this site's streamed push already left under the round's plan."""
        cfg = self.config
        pending: list[float] = []
        own_due = r.opened_at + cfg.round_deadline_s
        if r.local is None and not r.taken and presending:
            return math.inf  # part of the push is out: the round waits for the rest of it
        if r.local is None and not r.taken and now < own_due:
            pending.append(own_due)
        plan = r.plan
        for c in plan.children_of(self.site):
            if c in r.inputs:
                continue
            if c in plan.waits_tw:
                base = None if r.local_at is None else max(r.local_at, r.opened_at)
                t_w = cfg.t_w_s if plan.spec.t_w_s is None else plan.spec.t_w_s  # a scheduler's Eq. 3 t_w
                due = own_due if base is None else base + t_w
            else:
                due = r.opened_at + cfg.round_deadline_s * (1 + plan.height_of(c))
            if now < due:
                pending.append(due)
        root = plan.parent_of(self.site) is None and len(plan.core) == 1
        if pending:
            x = plan.spec.x_order
            if x and root and self.contributors(r, carry) >= x:
                return None  # STAR §IV-B static x-order: the first x sites are enough, the rest comes late
            return min(pending)
        if root and not self.enough_sites(r, carry):
            return math.inf
        return None

    def contributors(self, r: OpenRound, carry: Carry | None) -> int:
        """Distinct sites whose contributions this node holds for ``r`` (own push, carry, children)."""
        sites = {s for s, _ in r.own_ids}
        if r.local is not None:
            sites.add(self.site)
        if not r.taken and carry is not None:
            sites.update(s for s, _ in carry.ids)
        for m in r.inputs.values():
            sites.update(s for s, _ in m.sites)
        for _, ids in r.extras_in.values():
            sites.update(s for s, _ in ids)
        return len(sites)

    def enough_sites(self, r: OpenRound, carry: Carry | None) -> bool:
        """STAR §IV-B x-order with x = quorum: a root proceeds without late children only once that many
        sites contributed, or every child is in."""
        return self.contributors(r, carry) >= self.quorum or all(
            c in r.inputs for c in r.plan.children_of(self.site)
        )
