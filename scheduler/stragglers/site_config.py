"""Settings of the scheduler daemon's straggler policy (``[scheduler] policy = "stragglers"``), loaded from
the ``[scheduler.stragglers]`` table with its ``detection`` and ``batch`` sub-tables.

Kept apart from :mod:`scheduler.stragglers.daemon_policy` so the daemon's config can name it without
loading the policy's solvers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final, Literal, TypeAlias

from scheduler.barrier.local_steps_policy import LocalStepsConfig
from scheduler.stragglers.config import BatchConfig, DetectionConfig
from wanrt.config import check
from wanrt.protocol.job_settings import MAX_T_W_S, PLAN_TOPOLOGIES

__all__ = ["SITE_MODES", "TREE_TOPOLOGIES", "X_ORDER_TOPOLOGIES", "SiteMode", "SiteStragglerConfig"]

SiteMode: TypeAlias = Literal["adjust_bs", "parent_child", "x_order", "latency_tree"]
SITE_MODES: Final[tuple[SiteMode, ...]] = ("adjust_bs", "parent_child", "x_order", "latency_tree")
#: Plans with layers (one root), where STAR §IV-D2's site order changes who carries whose payloads.
TREE_TOPOLOGIES: Final = ("star", "tree")
#: Plans whose rounds have one root: the only ones where the engine can apply static x-order.
X_ORDER_TOPOLOGIES: Final = ("star", "tree")


@dataclass(frozen=True)
class SiteStragglerConfig:
    """ADJUST_BS across sites, driven by the gateways' telemetry.

    * ``detection`` — AntDT §VI-A2–4's two windows and λ (defaults: the paper's λ = 1.5, 5 and 10 minute
      windows). A job whose iterations take tenths of a second (``wanrt demo``) scales the windows down.
    * ``batch`` — Eq. 3's solver and per-rank bounds; its ``rebalance_gain`` is the least predicted drop
      of the slowest site's batch time that justifies announcing a new split (each announcement costs two
      round trips and a batch change, so noise in the measured throughputs must not trigger one).
    * ``trigger`` — which straggler kind starts ADJUST_BS. AntDT-ND (§VI-A3) adjusts batches for
      *transient* stragglers and kills *persistent* ones; a wanrt site cannot be killed and restarted by the
      scheduler (it is a whole cluster), so a persistent straggler site gets what AntDT-DD (§VI-B) gives
      deterministic stragglers: one ADJUST_BS that equalises batch processing time. ``persistent`` (the
      default) waits for the long window, so a site slow for a moment does not move batches around.
    * ``modes`` — what a persistent straggler site gets: ``adjust_bs`` (the above; the default, today's
      behaviour) and/or ``parent_child`` (STAR §IV-B: the site leaves the gateways' core and is attached
      to a core member that waits ``t_w`` for it, when Eq. 3 predicts less time to the same progress than
      BSP's Eq. 1; see :mod:`scheduler.stragglers.mode_policy`), and/or ``x_order`` (STAR §IV-B static
      x-order: the root goes on once the x fastest sites contributed, the others' pushes arrive in later
      rounds, when Eq. 1 with x < N predicts less time than with x = N). With both plan modes the one with
      the least predicted time wins (STAR-H). ``x_order`` needs ``noise_scale`` > 0 (with φ = 0 Eq. 1
      rates one site's gradient as good as all of them and always picks x = 1, asynchronous SGD) and a
      one-root ``base_topology`` (star or tree).
    * ``noise_scale`` — STAR's φ (PGNS, samples) for Eq. 1/3. STAR pre-computes it per model (§IV-C);
      sites do not report gradient norms to the scheduler, so it is configured. 0 (the default) counts a
      lost gradient as free, i.e. favours dropping the straggler; a larger φ values its samples more.
    * ``straggler_ratio`` — STAR §II's deviation ratio (T_i − min T)/min T above which a site is a
      predicted straggler at all (20 %).
    * ``max_wait_s`` — the largest t_w the Eq. 3 search may choose; STAR Fig. 29 finds the best waits
      between 30 and 300 ms, so 0.3 s.
    * ``switch_gain`` — Eq. 3 must beat Eq. 1 by this fraction to switch (and lose it to switch back), so
      two nearly equal predictions do not alternate the plan every decision.
    * ``base_topology`` — the plan announced when the stragglers recover: set it to the gateways'
      ``[rounds] topology``.
    * ``latency_tree`` in ``modes`` — STAR §IV-D2: the scheduler orders the gateways' tree by each site's
      measured cost (seconds to move one round's payload over its link, from the gateways' per-link
      telemetry) and announces ``site_costs`` when the tree's shape would change: the cheapest site becomes
      the root, a site with a slow link a leaf (:mod:`scheduler.stragglers.tree_policy`). Needs a one-root
      ``base_topology`` (tree or star): ring and all-pairs give every core member the same share, so
      there is no layer to move a slow site to.
    * ``tree_arity`` — the gateways' ``[rounds] tree_arity`` (the policy predicts the tree they build; 2).
    * ``tree_gain`` — the least fraction by which the new tree must lower the busiest link's predicted
      time per round (max over sites of tree edges × cost) to be announced (0.2: a re-plan costs the two
      phases, and measured link rates wander by ~10 %).
    * ``tree_slow_ratio`` — an edge proves its end slow when the other end did this many times better on
      another edge (1.5).
    * ``tree_min_busy_s`` — busy seconds a link window holds before it gives a rate (0.5 s).
    * ``tree_max_age_s`` — a link rate older than this is forgotten (120 s; links the new tree no longer
      uses stop being measured).
    * ``kill_restart`` — AntDT-ND's answer to a persistent straggler *rank* (§VI-A4, §V-E3): the scheduler
      orders that rank's trainer process restarted (``restart@<site>`` = rank), compared with its site's
      ranks (with one rank per site: with every rank of the job), from the per-rank times the site leaders
      report (``trainer.rank.<r>.compute_s``). Off by default: the trainers must run under a launcher that
      starts them again (``torchrun --max-restarts=N``) or set ``ClientConfig.on_restart``; a trainer run
      without either would just stop (docs/stragglers.md, "KILL_RESTART").
    * ``restart_cooldown_s`` — after a restart the rank is left alone this long (AntDT: its fresh windows
      fill first; the same default as :class:`~scheduler.stragglers.config.PolicyConfig`).
    * ``max_restarts`` — restarts per rank over the job (ours: a rank that stays slow on a fresh process
      is slow for a reason a restart does not fix; it then gets what a site straggler gets, ADJUST_BS).
    * ``local_steps`` — ``[scheduler.stragglers.local_steps]``, off by default: ElasticBSP's ZipLine
      (seed 003 §4) picks each site's local micro-steps per WAN iteration from its per-micro-step compute
      time, so every site reaches the WAN barrier at about the same time; announced as
      ``local_steps@<site>`` with ``batch_weight@<site>`` ∝ k·batch·ranks
      (:mod:`scheduler.barrier.local_steps_policy`, docs/local_steps.md).
    """

    detection: DetectionConfig = field(default_factory=DetectionConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    trigger: Literal["persistent", "transient"] = "persistent"
    modes: tuple[SiteMode, ...] = ("adjust_bs",)
    noise_scale: float = 0.0
    straggler_ratio: float = 0.2
    max_wait_s: float = 0.3
    switch_gain: float = 0.02
    base_topology: str = "tree"
    kill_restart: bool = False
    restart_cooldown_s: float = 1800.0
    max_restarts: int = 3
    local_steps: LocalStepsConfig = field(default_factory=LocalStepsConfig)
    tree_arity: int = 2
    tree_gain: float = 0.2
    tree_slow_ratio: float = 1.5
    tree_min_busy_s: float = 0.5
    tree_max_age_s: float = 120.0

    def __post_init__(self) -> None:
        check(type(self.kill_restart) is bool, "kill_restart", self.kill_restart, "true or false")
        check(
            math.isfinite(self.restart_cooldown_s) and 0.0 <= self.restart_cooldown_s <= 86_400.0,
            "restart_cooldown_s",
            self.restart_cooldown_s,
            "seconds in [0, 86400]",
        )
        check(
            type(self.max_restarts) is int and 0 <= self.max_restarts <= 1000,
            "max_restarts",
            self.max_restarts,
            "an integer in [0, 1000]",
        )
        check(self.trigger in ("persistent", "transient"), "trigger", self.trigger, "persistent or transient")
        check(
            len(self.modes) > 0 and set(self.modes) <= set(SITE_MODES),
            "modes",
            self.modes,
            f"a non-empty subset of {SITE_MODES}",
        )
        check(
            math.isfinite(self.noise_scale) and self.noise_scale >= 0,
            "noise_scale",
            self.noise_scale,
            "φ must be finite and ≥ 0",
        )
        if "x_order" in self.modes:
            check(
                self.noise_scale > 0,
                "noise_scale",
                self.noise_scale,
                "modes with x_order need φ > 0 (with φ = 0 Eq. 1 always picks x = 1: asynchronous SGD)",
            )
            check(
                self.base_topology in X_ORDER_TOPOLOGIES,
                "base_topology",
                self.base_topology,
                f"modes with x_order need a one-root topology: {' or '.join(X_ORDER_TOPOLOGIES)}",
            )
        if "latency_tree" in self.modes:
            check(
                self.base_topology in TREE_TOPOLOGIES,
                "base_topology",
                self.base_topology,
                f"modes with latency_tree need a one-root topology: {' or '.join(TREE_TOPOLOGIES)}",
            )
        check(
            type(self.tree_arity) is int and 1 <= self.tree_arity <= 1024,
            "tree_arity",
            self.tree_arity,
            "1..1024",
        )
        check(0.0 <= self.tree_gain < 1.0, "tree_gain", self.tree_gain, "must be in [0, 1)")
        check(1.0 < self.tree_slow_ratio <= 1000.0, "tree_slow_ratio", self.tree_slow_ratio, "(1, 1000]")
        check(0.0 < self.tree_min_busy_s <= 3600.0, "tree_min_busy_s", self.tree_min_busy_s, "(0, 3600] s")
        check(
            self.tree_min_busy_s <= self.tree_max_age_s <= 86_400.0,
            "tree_max_age_s",
            self.tree_max_age_s,
            "tree_min_busy_s..86400 s",
        )
        check(0.0 <= self.straggler_ratio <= 100.0, "straggler_ratio", self.straggler_ratio, "[0, 100]")
        check(0.0 <= self.max_wait_s <= MAX_T_W_S, "max_wait_s", self.max_wait_s, f"[0, {MAX_T_W_S:g}] s")
        check(0.0 <= self.switch_gain < 1.0, "switch_gain", self.switch_gain, "must be in [0, 1)")
        check(
            self.base_topology in PLAN_TOPOLOGIES and self.base_topology != "parent_child",
            "base_topology",
            self.base_topology,
            "a topology without stragglers: star, tree, ring or allpairs",
        )
