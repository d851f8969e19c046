"""AntDT's Monitor and Controller for whole sites, behind the scheduler node's
:class:`~scheduler.node.DecisionPolicy` interface (``[scheduler] policy = "stragglers"``).

Monitor (AntDT §VI-A2): each gateway's telemetry carries its site leader's last iteration —
``trainer.compute_s`` (the iteration minus the time blocked waiting for updates: the site's own batch
processing time T_i^w), ``trainer.batch_size`` (per rank) and ``trainer.world_size``. One sample per new
iteration goes into the site's short (L^trans) and long (L^per) windows of a
:class:`~scheduler.stragglers.detection.StragglerDetector`; the site's throughput v_i is the short-window
mean of B_i / T_i (§VI-A3, samples/s).

Controller: a site whose long-window time is ≥ λ × the mean over sites is a persistent straggler
(§VI-A4). AntDT-ND would KILL_RESTART it; a site is a whole cluster the scheduler cannot replace, so it gets
AntDT-DD's answer to a deterministic straggler (§VI-B2): ADJUST_BS with the batch sizes of Eq. 3
(``min z`` s.t. ``z ≥ B_i / v_i``, ``Σ B_i = B``) — the site batches that equalise batch processing time,
with the job's global batch B kept (up to rounding to whole per-rank batches). The split travels as
``batch_size@<site>`` (per rank) and ``batch_weight@<site>`` (the site's share of the samples × the site
count, so the cross-site average weights gradients by samples); the node announces it through the two
phases, with one effective iteration for every site (AntDT §V-F: global actions at the same iteration).

Once an adjustment is in force, each decision re-solves Eq. 3 over the current throughputs and announces
only if the slowest site's predicted batch time falls by more than ``rebalance_gain`` — which also undoes
the adjustment when the straggler recovers. Sans-IO: ``now`` comes in as an argument.

With ``modes`` including ``parent_child`` the same decision may also re-plan the gateways' WAN rounds
(STAR §IV-B/C, :mod:`scheduler.stragglers.mode_policy`): when a persistent straggler site makes Eq. 3
predict less time to the same progress than BSP's Eq. 1, the site is detached and attached to a core
member that waits the chosen t_w; when it recovers, the base plan is announced back. Both parts travel in
one announcement, so batch split and plan change at the same iteration.

With ``modes`` including ``latency_tree`` (STAR §IV-D2, :mod:`scheduler.stragglers.tree_policy`) the
gateways' per-link telemetry orders their tree: ``site_costs`` is announced when the measured costs call
for another tree shape, in the same decision as whatever else is due.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from scheduler.barrier.local_steps_policy import LocalStepsPolicy, lr_scale_for
from scheduler.stragglers.batch_alloc import allocate_greedy, allocate_milp, makespan
from scheduler.stragglers.decisions import AdjustBatch, KillRestart
from scheduler.stragglers.detection import DetectionReport, StragglerDetector
from scheduler.stragglers.mode_policy import SitePlanMode
from scheduler.stragglers.rank_restart import RankRestarts
from scheduler.stragglers.site_config import SiteStragglerConfig
from scheduler.stragglers.tree_policy import LatencyTreePolicy, TreeSettings
from wanrt.protocol.scheduler.messages import (
    RESTART_PREFIX,
    SITE_BATCH_PREFIX,
    SITE_LOCAL_STEPS_PREFIX,
    SITE_WEIGHT_PREFIX,
)

__all__ = ["SiteStragglerPolicy"]

log = logging.getLogger("scheduler.stragglers")


class SiteStragglerPolicy:
    """See the module docstring."""

    def __init__(self, sites: Sequence[str], cfg: SiteStragglerConfig | None = None) -> None:
        self.cfg = cfg or SiteStragglerConfig()
        self.sites = tuple(sorted(sites))
        self.detector = StragglerDetector(self.sites, self.cfg.detection, scope="site")
        self._world: dict[str, int] = {}
        self._reported: dict[str, int] = {}  # per-rank batch the site's trainers last reported
        self._last_iteration: dict[str, int] = {}
        self._running: dict[str, int] | None = None  # per-rank batches of the committed split
        self._total: int | None = None  # the job's global batch (samples), fixed at the first decision
        self.last_report: DetectionReport | None = None
        self.last_action: AdjustBatch | None = None
        self.plan = SitePlanMode(self.sites, self.cfg)
        #: AntDT-ND's KILL_RESTART of persistent straggler ranks (``kill_restart = true``)
        self.ranks = RankRestarts(self.sites, self.cfg)
        self.last_restarts: list[KillRestart] = []
        #: ElasticBSP's ZipLine over the sites' micro-step times (``[...local_steps] enabled = true``)
        self.local = LocalStepsPolicy(self.sites, self.cfg.local_steps)
        c = self.cfg
        #: STAR §IV-D2's latency tree from the links' measured rates (None: ``latency_tree`` not in modes)
        self.tree: LatencyTreePolicy | None = (
            LatencyTreePolicy(
                self.sites,
                TreeSettings(
                    c.base_topology,
                    c.tree_arity,
                    c.tree_gain,
                    c.tree_slow_ratio,
                    c.tree_min_busy_s,
                    c.tree_max_age_s,
                ),
            )
            if "latency_tree" in c.modes
            else None
        )

    # -- Monitor -------------------------------------------------------------------------------------

    def observe(self, site: str, metrics: Mapping[str, float], now: float) -> None:
        if site not in self.sites:
            return
        self.plan.reported(metrics)
        if self.tree is not None:
            self.tree.observe(site, metrics, now)
        it = metrics.get("trainer.iteration")
        compute = metrics.get("trainer.compute_s")
        per_rank = metrics.get("trainer.batch_size")
        world = metrics.get("trainer.world_size", 1.0)
        if it is None or compute is None or per_rank is None:
            return  # no trainer report yet (or a trainer that does not tell its batch size)
        if not all(math.isfinite(v) for v in (it, compute, per_rank, world)):
            return
        if compute <= 0 or per_rank < 1 or world < 1:
            return
        if int(it) <= self._last_iteration.get(site, -1):
            return  # the same iteration again: gateways report more often than a slow site steps
        self._last_iteration[site] = int(it)
        if self.ranks.waiting(site, int(it), now):
            return  # the last iterations of a process ordered restarted: not the site's new normal
        self._world[site] = int(world)
        self._reported[site] = int(per_rank)
        # a WAN iteration of k local micro-steps (ElasticBSP §4) computes k batches: T_i^w per batch is
        # compute / k, which is what Eq. 3's throughput and the straggler ratio compare across sites
        k = metrics.get("trainer.local_steps", 1.0)
        steps = int(k) if math.isfinite(k) and k >= 1 else 1
        self.detector.observe(site, now, float(compute) / steps, int(per_rank) * int(world))
        if self.cfg.local_steps.enabled:
            micro = metrics.get("trainer.micro_step_s", float(compute) / steps)
            self.local.observe(site, float(micro), now, steps)
        if self.cfg.kill_restart:
            self.ranks.observe(site, metrics, now, int(world), int(per_rank), steps)

    # -- Controller ----------------------------------------------------------------------------------

    def decide(self, now: float) -> dict[str, Any] | None:
        values = self._decide_sites(now)
        if self.tree is None or (values and any(k.startswith(RESTART_PREFIX) for k in values)):
            return values  # a restart order travels alone (the tree waits one decide tick)
        if self.plan.children or (values or {}).get("topology") == "parent_child":
            return values  # a parent–child plan runs a ring: no layers to order until it is back to base
        tree = self.tree.decide(now)
        if not tree:
            return values
        return {**(values or {}), **tree}

    def _decide_sites(self, now: float) -> dict[str, Any] | None:
        restarts = self.ranks.decide(now)
        if restarts:
            # a node action (AntDT §V-E3) on its own: the site's batch split waits for the fresh process
            self.last_restarts = restarts
            order: dict[str, Any] = {}
            for d in restarts:
                site, _, rank = d.member.rpartition("/")
                order[RESTART_PREFIX + site] = int(rank)
                self.detector.forget(site)  # its slow samples were the old process's
            return order
        if len(self._reported) < len(self.sites):
            return None  # a site without a report has no throughput to allocate by
        per_rank = self._running or self._reported
        if self._total is None:
            self._total = sum(per_rank[s] * self._world[s] for s in self.sites)
        report = self.detector.report(now)
        self.last_report = report
        slow = report.persistent if self.cfg.trigger == "persistent" else report.persistent + report.transient
        if self.cfg.kill_restart:  # a site whose slow rank may still be restarted waits for that first
            slow = [s for s in slow if not self.ranks.awaits_restart(s, now)]
        plan_on = "parent_child" in self.cfg.modes or "x_order" in self.cfg.modes
        steps = self.local.decide(now) if self.cfg.local_steps.enabled else None
        if not slow and self._running is None and not (plan_on and self.plan.detached):
            return self._values(per_rank, steps, batches=False) if steps else None
        rates = [self.detector.throughput(s, now) for s in self.sites]
        if any(r is None or r <= 0 for r in rates):
            return None
        v = np.array(rates, dtype=np.float64)
        values: dict[str, Any] = {}
        # a site of k local micro-steps takes k batches per WAN iteration (ElasticBSP §4)
        ks = dict(self.local.running) if self.cfg.local_steps.enabled else {}
        if plan_on:
            # each site's predicted iteration time: its current samples over its throughput (STAR §IV-A)
            times = {
                s: ks.get(s, 1) * per_rank[s] * self._world[s] / float(r)
                for s, r in zip(self.sites, v, strict=True)
            }
            values.update(self.plan.decide(times, float(self._total), report.persistent, now) or {})
        # local steps and ADJUST_BS balance the same thing (each site's time per WAN iteration) with two
        # levers; run together, ADJUST_BS equalises the per-batch times that local steps already scaled by
        # k and the fast site ends up k times slower (seen in the emulated straggler demo: k = 11 and then
        # 120 vs 8 samples for the same site). With local steps on, they are the lever.
        if (
            "adjust_bs" in self.cfg.modes
            and not self.cfg.local_steps.enabled
            and (slow or self._running is not None)
        ):
            values.update(self._adjust_batches(now, per_rank, slow, v, steps) or {})
        if steps and SITE_BATCH_PREFIX + self.sites[0] not in values:
            values.update(self._values(per_rank, steps, batches=False))
        return values or None

    def _adjust_batches(
        self,
        now: float,
        per_rank: Mapping[str, int],
        slow: Sequence[str],
        v: np.ndarray,
        steps: Mapping[str, int] | None = None,
    ) -> dict[str, Any] | None:
        """AntDT Eq. 3's split, if it shortens the slowest site's batch time by ``rebalance_gain``."""
        assert self._total is not None  # set by decide() before
        worlds = np.array([self._world[s] for s in self.sites], dtype=np.int64)
        bc = self.cfg.batch
        lo, hi = bc.min_batch * worlds, np.minimum(bc.max_batch, self._total) * worlds
        if not lo.sum() <= self._total <= hi.sum():
            return None  # the bounds cannot hold this global batch (ConfigError-worthy, but not a crash)
        if bc.solver == "milp":
            site_batch = allocate_milp(v, self._total, lo, hi, time_limit_s=bc.milp_time_limit_s)
        else:
            site_batch = allocate_greedy(v, self._total, lo, hi)
        new = {
            s: int(min(bc.max_batch, max(bc.min_batch, round(int(b) / w))))
            for s, b, w in zip(self.sites, site_batch, worlds, strict=True)
        }
        cur = np.array([per_rank[s] * self._world[s] for s in self.sites], dtype=np.float64)
        after = np.array([new[s] * self._world[s] for s in self.sites], dtype=np.float64)
        before_bpt, after_bpt = makespan(cur, v), makespan(after, v)
        gain = 1.0 - after_bpt / before_bpt if before_bpt > 0 else 0.0
        if new == dict(per_rank) or gain <= bc.rebalance_gain:
            return None
        why = (
            f"persistent straggler site(s) {', '.join(slow)}"
            if slow
            else "stragglers recovered: re-balancing by Eq. 3"
        )
        self.last_action = AdjustBatch(now, dict(new), after_bpt, before_bpt, why)
        log.info(
            "ADJUST_BS (%s): per-rank batches %s → %s; slowest batch time %.3g → %.3g s (Eq. 3)",
            why,
            dict(per_rank),
            new,
            before_bpt,
            after_bpt,
        )
        return self._values(new, steps)

    def _values(
        self, per_rank: Mapping[str, int], steps: Mapping[str, int] | None = None, *, batches: bool = True
    ) -> dict[str, Any]:
        """The split as values: per-rank batches, and each site's weight = its share of the WAN iteration's
        samples × the site count, where a site of k local micro-steps contributes k·batch·ranks samples
        (the trainer divides its accumulated gradient by ranks × k: docs/local_steps.md). New k's
        (``steps``) travel with them, and the job's ``lr_scale`` for the samples they make (STAR §IV-C;
        ``lr_scaling = "none"``: not announced), so batches, weights, k's and learning rate change at one
        iteration; without a new split (``batches=False``) the batches in force stay unannounced."""
        ks = dict(self.local.running)
        if steps:
            ks.update(steps)
        samples = {s: per_rank[s] * self._world[s] * ks[s] for s in self.sites}
        total = sum(samples.values())
        values: dict[str, Any] = {}
        for s in self.sites:
            if batches:
                values[SITE_BATCH_PREFIX + s] = int(per_rank[s])
            values[SITE_WEIGHT_PREFIX + s] = samples[s] * len(self.sites) / total
            if steps:
                values[SITE_LOCAL_STEPS_PREFIX + s] = int(ks[s])
        if steps:
            # STAR §IV-C's ADJUST_LR: the job's rate follows the WAN iteration's samples (k = 1: scale 1)
            lc = self.cfg.local_steps
            base = sum(per_rank[s] * self._world[s] for s in self.sites)
            scale = lr_scale_for(total, base, lc.lr_scaling, lc.max_lr_scale)
            if scale is not None:
                values["lr_scale"] = scale
        return values

    def committed(self, values: Mapping[str, Any], effective_iteration: int) -> None:
        """The split in ``values`` runs from ``effective_iteration`` everywhere (a manual change too)."""
        self.plan.committed(values)
        if self.tree is not None:
            self.tree.committed(values, effective_iteration)
        for key in values:
            if key.startswith(RESTART_PREFIX):
                self.ranks.committed(key[len(RESTART_PREFIX) :], effective_iteration)
        ks = {s: values.get(SITE_LOCAL_STEPS_PREFIX + s) for s in self.sites}
        self.local.committed({s: k for s, k in ks.items() if type(k) is int and k >= 1})
        split = {s: values.get(SITE_BATCH_PREFIX + s) for s in self.sites}
        if all(isinstance(b, (int, float)) and not isinstance(b, bool) and b >= 1 for b in split.values()):
            self._running = {s: int(b) for s, b in split.items() if isinstance(b, (int, float))}
