"""Which plan governs which iteration, as members are lost and rejoin and the scheduler changes the topology.

Why a timeline and not one current plan. Gateways learn of a change at different moments, so a change
must name the iteration it applies from: a rejoining site takes part from the iteration it joins at (the
same number at every gateway, passed by the daemon), a new topology from the scheduler is effective from
"iteration N, the same N everywhere". A lost site is removed at once from every unfinished round, because
rounds in flight must not wait for it. The plan of an iteration is then a pure function of (spec, members at
that iteration), so every gateway with the same inputs computes the same plan (STAR §IV-D2 rebuilds its tree
before each iteration in the same spirit).
"""

from __future__ import annotations

from gateways.rounds.topology import Plan, PlanSpec, build_plan
from wanrt.protocol.peer.contrib_ids import intern_sites

__all__ = ["PlanTimeline"]

#: distinct (spec, member set) plans kept built; a job sees a handful, this only bounds a pathological churn
_PLAN_CACHE_LIMIT = 256

#: Plans built in this process, shared by every timeline. A plan is a frozen, deterministic function of
#: (spec, members) (see :mod:`gateways.rounds.topology`), so one built object can serve every engine that
#: asks for the same inputs: a daemon has one engine, but the simulator runs 1 000 of them in one process,
#: and building the same 1 000-member tree once per gateway took half of its set-up.
_SHARED: dict[tuple[PlanSpec, frozenset[str]], Plan] = {}


def shared_plan(spec: PlanSpec, members: frozenset[str]) -> Plan:
    """``build_plan(spec, members)``, built once per process for equal inputs (bounded cache)."""
    key = (spec, members)
    plan = _SHARED.get(key)
    if plan is None:
        if len(_SHARED) >= _PLAN_CACHE_LIMIT:
            _SHARED.clear()
        plan = _SHARED[key] = build_plan(spec, members)
    return plan


class PlanTimeline:
    """Live members with their join iterations, and topology specs with their effective iterations."""

    def __init__(self, spec: PlanSpec, members: set[str]) -> None:
        self.live: set[str] = set(members)
        self._joins: dict[str, int] = {}
        self._specs: list[tuple[int, PlanSpec]] = [(-1, spec)]
        self._by_iteration: dict[int, Plan] = {}
        # the member set when no join is pending (the usual case), built once per membership change: a
        # 1 000-site job would otherwise rebuild a 1 000-name set for every new iteration
        self._all_live: frozenset[str] | None = None

    def plan_for(self, iteration: int) -> Plan:
        plan = self._by_iteration.get(iteration)
        if plan is not None:
            return plan
        spec = self._specs[0][1]
        for eff, s in self._specs:
            if eff <= iteration:
                spec = s
        if self._joins:
            members = frozenset(s for s in self.live if self._joins.get(s, -1) <= iteration)
        else:
            if self._all_live is None:
                self._all_live = intern_sites(self.live)
            members = self._all_live
        plan = shared_plan(spec, members)
        if len(self._by_iteration) >= _PLAN_CACHE_LIMIT:
            self._by_iteration.clear()
        self._by_iteration[iteration] = plan
        return plan

    def lose(self, site: str) -> bool:
        """Remove ``site`` from every iteration; False if it was not live."""
        if site not in self.live:
            return False
        self.live.discard(site)
        self._joins.pop(site, None)
        self._all_live = None
        self._by_iteration.clear()
        return True

    def join(self, site: str, iteration: int) -> None:
        """``site`` takes part from ``iteration`` on (and not before, even if it was live)."""
        self.live.add(site)
        self._joins[site] = iteration
        self._all_live = None
        self._by_iteration.clear()

    @property
    def joins(self) -> dict[str, int]:
        """Joins still pending in some open iteration: site -> the iteration it takes part from."""
        return dict(self._joins)

    def set_spec(self, spec: PlanSpec, effective: int) -> None:
        self._specs = [(e, s) for e, s in self._specs if e < effective] + [(effective, spec)]
        self._by_iteration.clear()

    def forget_before(self, iteration: int) -> None:
        """Drop history no open iteration can need (joins and specs superseded before ``iteration``)."""
        for s, j in list(self._joins.items()):
            if j <= iteration:
                del self._joins[s]
        older = [k for k, (e, _) in enumerate(self._specs) if e <= iteration]
        if len(older) > 1:
            self._specs = self._specs[older[-1] :]
        self._by_iteration.clear()
