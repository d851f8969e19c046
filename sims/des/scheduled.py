"""A simulated job with a scheduler policy in the loop: the gateways' real telemetry goes to a decision
policy every ``report_s`` of virtual time, and what it decides is committed to every gateway at one
effective iteration, as :class:`~scheduler.node.SchedulerNode` does through its two phases.

Why not the scheduler node itself: its decisions wait for replies over links, which the simulator does not
model; what matters here is that the policy sees only what a gateway measures (``GatewayNode.telemetry``,
not the scenario's link rates) and that every gateway adopts the same values at the same iteration. The
values are merged with the running decision's (a key a decision leaves out keeps its value), exactly as
``SchedulerNode._want`` merges them, and each gateway gets the prepare then the commit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from sims.des.scenario import Scenario
from sims.des.world import Simulation
from wanrt.protocol.scheduler.messages import Announce

__all__ = ["Commit", "PolicyLike", "ScheduledSimulation"]


class PolicyLike(Protocol):
    """The part of :class:`~scheduler.node.DecisionPolicy` the simulation drives."""

    def observe(self, site: str, metrics: Mapping[str, float], now: float) -> None: ...

    def decide(self, now: float) -> dict[str, Any] | None: ...

    def committed(self, values: Mapping[str, Any], effective_iteration: int) -> None: ...


class Commit:
    """One committed decision: when, from which iteration, with which (merged) values."""

    __slots__ = ("at", "decision", "effective_iteration", "values")

    def __init__(self, decision: int, at: float, effective_iteration: int, values: dict[str, Any]) -> None:
        self.decision = decision
        self.at = at
        self.effective_iteration = effective_iteration
        self.values = values


class ScheduledSimulation(Simulation):
    """See the module docstring. ``margin`` iterations beyond every gateway's safe iteration."""

    def __init__(
        self,
        sc: Scenario,
        policy: PolicyLike,
        *,
        report_s: float = 0.5,
        margin: int = 1,
        clock: Callable[[], float] | None = None,
        keep_payloads: bool = False,
    ) -> None:
        super().__init__(sc, clock=clock, keep_payloads=keep_payloads)
        self.policy = policy
        self.report_s = report_s
        self.margin = margin
        self.commits: list[Commit] = []
        self._values: dict[str, Any] = {}

    def _build(self) -> None:
        super()._build()
        self.loop.at(self.report_s, self._report)

    def _report(self) -> None:
        now = self.loop.now
        for s in self.names:
            self.policy.observe(s, self.nodes[s].telemetry(now).metrics, now)
        values = self.policy.decide(now)
        if values:
            merged = {**self._values, **values}
            if merged != self._values:
                self.commit(merged)
        if not self._done():
            self.loop.at(now + self.report_s, self._report)

    def commit(self, values: dict[str, Any]) -> Commit:
        """Prepare and commit ``values`` at every gateway, effective past every gateway's safe iteration."""
        now = self.loop.now
        window = self.sc.gateway.rounds.window
        frontier = max(-1 if n.engine is None else n.engine.frontier for n in self.nodes.values())
        eff = frontier + window + 2 + self.margin
        c = Commit(len(self.commits) + 1, now, eff, dict(values))
        for phase in ("prepare", "commit"):
            for s in self.names:
                self.nodes[s].scheduler_message(Announce(c.decision, phase, eff, dict(values)), now)
                self._after(s)
        self._values = dict(values)
        self.commits.append(c)
        self.policy.committed(values, eff)
        return c
