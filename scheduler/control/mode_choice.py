"""The scheduler's choice of exchange mode (issue 23 item 4): per-step sparse exchange, DiLoCo with H, or
streaming with a fragment count, and the pseudo-gradient's value coding — the candidate of least predicted
time per unit of progress (:mod:`scheduler.control.mode_cost`), re-planned when the link or the step time
changes, switched only for a real gain.

A :class:`ModePlan` is the mode's decision, like StellaTrain's :class:`~scheduler.control.decision.Decision`:
a frozen value with its reason and predictions. The policy leaves ``effective_iteration`` empty; the
scheduler node announces the plan's settings (``outer_steps``, ``fragments``, ``outer_coding``) for one
job-wide iteration like every other decision, and the filled plan comes back through :meth:`ModeChooser.
confirm`. Every site's outer loop reads the settings in force when it starts an outer step, a function of
the iteration alone, so all sites switch at the same inner step.

Re-planning (StellaTrain §4.1 ⑥'s trigger, applied to the mode): a first plan once measurements exist, then
only when the bandwidth or the compute per step moved by ``replan_change`` since the plan in force; and a
new mode replaces the running one only if predicted ``switch_gain`` faster (hysteresis: a switch drops the
outer step in progress and costs an announcement round, and the estimate is noisy). Sans-IO.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from scheduler.control.mode_config import Mode, ModeConfig
from scheduler.control.mode_cost import LinkState, ModeCandidate, candidates

__all__ = ["ModeChooser", "ModePlan", "ModeReason", "best_candidate"]

ModeReason = Literal["initial", "bandwidth_change", "compute_change"]


@dataclass(frozen=True, slots=True)
class ModePlan:
    """One mode decision: the settings, why, and the predictions it was made on."""

    mode: Mode
    outer_steps: int
    fragments: int
    #: the pseudo-gradient's coding (per-step: the trainers' own wire dtype, never announced)
    coding: str
    reason: ModeReason
    decided_at: float
    bandwidth_bps: float
    compute_s: float
    #: the chosen candidate's predicted seconds per inner step and per unit of progress
    predicted_iteration_s: float
    predicted_cost_s: float
    #: the best candidate of each mode (label, predicted seconds per unit of progress): what it beat
    alternatives: tuple[tuple[str, float], ...]
    effective_iteration: int | None = None

    @property
    def label(self) -> str:
        return _label(self.mode, self.outer_steps, self.fragments, self.coding)

    @property
    def why(self) -> str:
        """One line for /status, the decisions file and the log."""
        others = ", ".join(f"{lab} {c:.3g}" for lab, c in self.alternatives if lab != self.label)
        return (
            f"{self.reason}: {self.label} at {self.predicted_cost_s:.3g} s/step-equivalent "
            f"({self.bandwidth_bps / 1e6:.3g} Mbit/s, compute {self.compute_s * 1e3:.3g} ms/step); "
            f"best of the others: {others or 'none'}"
        )

    def view(self) -> dict[str, Any]:
        """The plan as /status and the decisions file show it."""
        return {
            "mode": self.mode,
            "outer_steps": self.outer_steps,
            "fragments": self.fragments,
            "coding": self.coding,
            "reason": self.reason,
            "why": self.why,
            "bandwidth_bps": self.bandwidth_bps,
            "compute_s": self.compute_s,
            "predicted_iteration_s": self.predicted_iteration_s,
            "predicted_cost_s": self.predicted_cost_s,
            "alternatives": dict(self.alternatives),
            "effective_iteration": self.effective_iteration,
        }

    def effective_from(self, iteration: int) -> ModePlan:
        return dataclasses.replace(self, effective_iteration=iteration)


def _label(mode: Mode, h: int, f: int, coding: str) -> str:
    return ModeCandidate(mode, h, f, coding, 1.0, 1.0, 0.0).label


def best_candidate(cands: list[ModeCandidate]) -> ModeCandidate:
    """The least predicted cost; ties go to the earlier candidate (per-step, then smaller H)."""
    return min(enumerate(cands), key=lambda ic: (ic[1].cost_s, ic[0]))[1]


def _per_mode(cands: list[ModeCandidate]) -> tuple[tuple[str, float], ...]:
    best: dict[str, ModeCandidate] = {}
    for c in cands:
        if c.mode not in best or c.cost_s < best[c.mode].cost_s:
            best[c.mode] = c
    return tuple((c.label, c.cost_s) for c in best.values())


class ModeChooser:
    """See the module docstring."""

    def __init__(self, config: ModeConfig) -> None:
        self.cfg = config
        #: the plan in force (confirmed at its effective iteration), and the one announced, not yet in force
        self.current: ModePlan | None = None
        self.pending: ModePlan | None = None

    def _reason(self, state: LinkState) -> ModeReason | None:
        ref = self.pending or self.current
        if ref is None:
            return "initial"
        change = self.cfg.replan_change
        if abs(state.bandwidth_bps - ref.bandwidth_bps) > change * ref.bandwidth_bps:
            return "bandwidth_change"
        if abs(state.compute_s - ref.compute_s) > change * ref.compute_s:
            return "compute_change"
        return None

    def plan(self, state: LinkState, now: float) -> ModePlan | None:
        """A new plan when one is due and its mode differs from the running one (None: keep it). A re-plan
        that keeps the mode updates what the next re-plan is measured against, without an announcement."""
        reason = self._reason(state)
        if reason is None:
            return None
        cands = candidates(state, self.cfg)
        choice = best_candidate(cands)
        ref = self.pending or self.current
        if ref is not None:
            running = next((c for c in cands if c.label == ref.label), None)
            if running is not None and running.cost_s <= choice.cost_s * (1.0 + self.cfg.switch_gain):
                choice = running  # not worth a switch
        plan = ModePlan(
            mode=choice.mode,
            outer_steps=choice.outer_steps,
            fragments=choice.fragments,
            coding=choice.coding,
            reason=reason,
            decided_at=now,
            bandwidth_bps=state.bandwidth_bps,
            compute_s=state.compute_s,
            predicted_iteration_s=choice.iteration_s,
            predicted_cost_s=choice.cost_s,
            alternatives=_per_mode(cands),
        )
        if ref is not None and plan.label == ref.label:
            # same mode: the reference moves (so a slow drift does not re-plan every tick), no announcement
            if self.pending is not None:
                self.pending = dataclasses.replace(plan, effective_iteration=None)
            else:
                self.current = dataclasses.replace(plan, effective_iteration=ref.effective_iteration)
            return None
        self.pending = plan
        return plan

    def confirm(self, effective_iteration: int) -> ModePlan | None:
        """The announced plan is committed from ``effective_iteration`` on (job-wide); returns it filled."""
        if self.pending is None:
            return None
        self.current = self.pending.effective_from(effective_iteration)
        self.pending = None
        return self.current

    def abandon(self) -> None:
        """The announced plan was not committed (an operator's values replaced it): plan again next tick."""
        self.pending = None
