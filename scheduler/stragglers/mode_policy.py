"""STAR's mode choice for whole sites: keep every site in the gateways' plan (BSP, Eq. 1 with x = N), detach
the slowest and attach them to a core member that waits t_w (parent–child, Eq. 3), or let the root go on
once the x fastest sites contributed (static x-order, Eq. 1 with x < N).

STAR §IV-B (all-reduce architecture): straggling members are removed from the ring and each is attached to
a well-connected ring member, its parent, which waits ``t_w`` after its own computation for the child's
gradient before joining the ring; a gradient later than that is left out of the update (here: carried into
the next round, never dropped). §IV-C picks the mode with the least predicted time to a fixed training
progress, ``(1 + φ/(y·M/N)) · t`` (Eq. 1 for BSP, Eq. 3 with t = t_ring + t_w and y = N − x + q for
parent–child), computed by :func:`scheduler.stragglers.star_modes.choose_mode`. Static x-order (§IV-B, the
PS family) maps onto a one-root plan: the root finishes a round once x distinct sites contributed, a late
site's push is carried into a later round (never dropped); Eq. 1 then counts y = x reports per update.

The inputs are those the scheduler daemon has: each site's predicted iteration time is its current batch
over its short-window throughput (AntDT's v_i, from the gateways' telemetry), M the job's global batch, φ
configured (STAR pre-computes it per model). The output is the gateways' plan settings
(:data:`wanrt.protocol.job_settings.PLAN_KEYS`), announced through the scheduler's two phases so every gateway
adopts the same plan at the same iteration.

Two rules are ours: a switch out of the base plan needs a *persistent* straggler (AntDT's long window), so a
site slow for a moment does not re-plan the WAN; and any switch must beat the running mode's predicted time
(re-evaluated under the new times) by ``switch_gain``, so near-ties do not alternate — except the way
back to the base plan, which only has to be no worse. Sans-IO.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from scheduler.stragglers.config import ModeConfig
from scheduler.stragglers.site_config import SiteStragglerConfig
from scheduler.stragglers.star_modes import TIE_REL, ModeChoice, choose_mode, evaluate_mode
from wanrt.protocol.job_settings import PlanSettings, PlanTopology

__all__ = ["PlanChoice", "SitePlanMode"]

log = logging.getLogger("scheduler.stragglers")


@dataclass(frozen=True)
class PlanChoice:
    """What the last decision saw: Eq. 1's time, the chosen mode's, and the running mode's."""

    at: float
    chosen: ModeChoice
    bsp_s: float
    running_s: float
    announced: bool


class SitePlanMode:
    """See the module docstring."""

    def __init__(self, sites: Sequence[str], cfg: SiteStragglerConfig) -> None:
        self.cfg = cfg
        self.sites = tuple(sorted(sites))
        plan_modes = tuple(m for m in ("x_order", "parent_child") if m in cfg.modes)
        self.x_order_on = "x_order" in plan_modes
        self.mode_cfg = ModeConfig(
            modes=("bsp", *plan_modes),
            straggler_ratio=cfg.straggler_ratio,
            switch_gain=cfg.switch_gain,
            max_wait_s=cfg.max_wait_s,
        )
        self.children: tuple[str, ...] = ()  # the committed plan's detached sites (empty: base plan)
        self.wait_s = 0.0  # its t_w
        self.x_order = 0  # the committed static x-order (0: wait for every site)
        self.known = False  # the running plan was committed by us or reported by a gateway
        self.last: PlanChoice | None = None

    @property
    def detached(self) -> bool:
        """The running plan is not the base plan (a site detached, or rounds going on without some)."""
        return bool(self.children) or self.x_order > 0

    def _running(self) -> ModeChoice:
        n = len(self.sites)
        if self.children:
            kids = tuple(i for i, s in enumerate(self.sites) if s in self.children)
            ring = tuple(i for i in range(n) if i not in kids)
            return ModeChoice("parent_child", 0.0, len(kids), self.wait_s, (ring, kids), (float(n),))
        if 0 < self.x_order < n:
            x = self.x_order
            return ModeChoice("x_order", 0.0, x, 0.0, (tuple(range(x)),), (float(x),))
        return ModeChoice("bsp", 0.0, n, 0.0, (tuple(range(n)),), (float(n),))

    def decide(
        self, times: Mapping[str, float], total_batch: float, persistent: Sequence[str], now: float
    ) -> PlanSettings | None:
        """The plan settings to announce, or None to keep the running plan."""
        t = np.array([times[s] for s in self.sites], dtype=np.float64)
        phi = self.cfg.noise_scale
        choice = choose_mode(t, phi, total_batch, self.mode_cfg)
        bsp_s = evaluate_mode(_bsp(len(t)), t, phi, total_batch)
        running_s = evaluate_mode(self._running(), t, phi, total_batch)
        kids = tuple(self.sites[i] for i in choice.groups[1]) if choice.kind == "parent_child" else ()
        wait = choice.wait if kids else 0.0
        x = choice.order if choice.kind == "x_order" else 0
        same = kids == self.children and (not kids or wait == self.wait_s) and x == self.x_order
        better = choice.time < running_s * (1.0 - self.cfg.switch_gain)
        # back to the base plan needs only to be no worse (STAR-H's ties go to the simpler mode): a
        # recovered site predicts the same time in or out of the core, and the core is where it belongs
        base = not kids and not x
        back = base and self.detached and choice.time <= running_s * (1.0 + TIE_REL)
        entering = not base and not self.detached
        announce = not same and (better or back) and (not entering or bool(persistent))
        self.last = PlanChoice(now, choice, bsp_s, running_s, announce)
        if not announce:
            return None
        if kids:
            why, plan = f"persistent straggler site(s) {', '.join(persistent)}", "parent_child"
            detail = f"detached {','.join(kids)}, t_w {wait:.3g} s"
        elif x:
            why, plan = f"persistent straggler site(s) {', '.join(persistent)}", self.cfg.base_topology
            fastest = ",".join(self.sites[i] for i in choice.groups[0])
            detail = f"x-order {x} of {len(self.sites)} (fastest now: {fastest})"
        else:
            why, plan = "stragglers recovered: every site back in the plan", self.cfg.base_topology
            detail = "every site in every round"
        log.info(
            "plan %s (%s): %s; predicted time to progress %.3g → %.3g s (Eq. 1 BSP %.3g s, φ=%g; "
            "STAR §IV-B/C)",
            plan,
            why,
            detail,
            running_s,
            choice.time,
            bsp_s,
            phi,
        )
        x_order = x if self.x_order_on else None
        if kids:
            return PlanSettings("parent_child", kids, float(wait), x_order)
        kind = cast(PlanTopology, self.cfg.base_topology)  # SiteStragglerConfig checks it is one
        return PlanSettings(kind, (), None, x_order)

    def reported(self, metrics: Mapping[str, float]) -> None:
        """A gateway's report of the plan it runs (``plan.*``): a scheduler that restarted learns from it
        which sites are detached (or the x-order), so their recovery is still announced."""
        if self.known or "plan.parent_child" not in metrics:
            return
        self.known = True
        if metrics["plan.parent_child"] == 1.0:
            self.children = tuple(s for s in self.sites if metrics.get(f"plan.straggler.{s}") == 1.0)
            self.wait_s = float(metrics.get("plan.t_w_s", 0.0)) if self.children else 0.0
        x = metrics.get("plan.x_order", 0.0)
        self.x_order = int(x) if 0 < x < len(self.sites) else 0

    def committed(self, values: PlanSettings) -> None:
        """The plan in ``values`` runs everywhere now (a manual change too)."""
        topology = values.topology
        stragglers = values.stragglers
        x = values.x_order
        if topology is None and stragglers is None and x is None:
            return
        self.known = True
        if x is not None:
            self.x_order = x if type(x) is int and 0 < x < len(self.sites) else 0
        if topology is None and stragglers is None:
            return
        kids: tuple[str, ...] = ()
        if topology == "parent_child" and stragglers is not None:
            kids = tuple(s for s in stragglers if s in self.sites)
        self.children = kids
        tw = values.t_w_s
        self.wait_s = float(tw) if isinstance(tw, (int, float)) and kids else 0.0


def _bsp(n: int) -> ModeChoice:
    return ModeChoice("bsp", 0.0, n, 0.0, (tuple(range(n)),), (float(n),))
