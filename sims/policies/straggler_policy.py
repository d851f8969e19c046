"""The straggler policy: telemetry in, typed decisions out (AntDT's Controller + STAR's mode choice).

Two questions, two papers:

* **Ranks** (trainer processes, whose batch sizes the scheduler sets): AntDT-ND §VI-A. Batch sizes start
  even (B/n); each decision classifies ranks on the two BPT windows; a persistent straggler is killed and
  restarted when the cluster is not busy; a transient one (or, ours, a stale allocation that Eq. 3 would
  improve by more than ``rebalance_gain``) triggers ADJUST_BS with Eq. 3's allocation over the
  short-window throughputs.
* **Sites** (whole clusters behind one gateway, whose WAN plan the scheduler sets): STAR §IV. From the
  sites' predicted iteration times (given, or the short-window means as a fallback) and the gradient
  noise scale, pick bsp / x-order / parent–child by Eq. 1–3; a switch emits the mode decision and
  ADJUST_LR. The latency tree (STAR §IV-D2) is rebuilt when the sites' costs reorder it.

A WAN-wide slowdown (every link slower than its own past) is reported as a NONE decision with that
reason: no straggler action helps, the bandwidth estimator must react. Everything here is plain data; the
daemon passes ``now`` and decides the effective iteration.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from scheduler.stragglers.batch_alloc import allocate_greedy, allocate_milp, makespan
from scheduler.stragglers.config import PolicyConfig
from scheduler.stragglers.decisions import (
    AdjustBatch,
    AdjustLr,
    BackupWorkers,
    KillRestart,
    NoAction,
    ParentChild,
    StragglerDecision,
    TreeRebuild,
)
from scheduler.stragglers.detection import (
    DetectionReport,
    LinkReport,
    LinkSlowdownDetector,
    StragglerDetector,
)
from scheduler.stragglers.noise_scale import NoiseScale
from scheduler.stragglers.star_modes import (
    ModeChoice,
    choose_mode,
    evaluate_mode,
    predicted_stragglers,
    scaled_lr,
)
from scheduler.stragglers.tree import latency_tree
from wanrt.errors import ConfigError, LocalProtocolError

__all__ = ["StragglerPolicy"]


class StragglerPolicy:
    """Detection, batch allocation, mode choice and tree for one job."""

    def __init__(
        self,
        ranks: Iterable[str],
        global_batch: int,
        *,
        sites: Iterable[str] = (),
        links: Iterable[str] = (),
        lr: float = 0.1,
        cfg: PolicyConfig | None = None,
    ) -> None:
        self.cfg = cfg or PolicyConfig()
        self.ranks = StragglerDetector(ranks, self.cfg.detection, scope="rank")
        self.sites = StragglerDetector(sites, self.cfg.detection, scope="site")
        self.links = LinkSlowdownDetector(links, self.cfg.links)
        self.noise = NoiseScale(self.cfg.noise)
        names = self.ranks.members
        if not names:
            raise ConfigError("at least one rank is needed", key="ranks")
        bc = self.cfg.batch
        if not len(names) * bc.min_batch <= global_batch <= len(names) * bc.max_batch:
            raise ConfigError(
                "the global batch cannot be split within [min_batch, max_batch] per rank",
                key="global_batch",
                value=global_batch,
            )
        self.global_batch = global_batch
        self.lr = lr
        even = np.full(len(names), global_batch // len(names), dtype=np.int64)
        even[: global_batch - int(even.sum())] += 1  # AntDT §VI-A1: B_i = B/n
        self._batch: dict[str, int] = dict(zip(names, (int(b) for b in even), strict=True))
        self._restarted: dict[str, float] = {}
        self._site_names: list[str] = []
        self._mode: ModeChoice | None = None
        self._tree: dict[str, str | None] | None = None

    # -- telemetry -----------------------------------------------------------------------------------

    def observe_rank(self, rank: str, now: float, bpt_s: float, batch: int | None = None) -> None:
        """A rank's batch processing time (its current batch size unless another is given)."""
        if rank not in self._batch:
            raise LocalProtocolError("unknown rank", peer=rank)
        self.ranks.observe(rank, now, bpt_s, self._batch[rank] if batch is None else batch)

    def observe_site(self, site: str, now: float, iteration_s: float) -> None:
        self.sites.observe(site, now, iteration_s)

    def observe_links(
        self, now: float, link_times: Mapping[str, float], confirmed: Iterable[str] = ()
    ) -> None:
        """Per-link times of one iteration and the gateway allocator's confirmed straggler links."""
        self.links.observe(now, link_times, confirmed)

    def observe_gradient_norms(
        self, small_sq: Sequence[float], small_batch: Sequence[int], big_sq: float, big_batch: int
    ) -> None:
        self.noise.observe_norms(small_sq, small_batch, big_sq, big_batch)

    @property
    def batch_sizes(self) -> dict[str, int]:
        return dict(self._batch)

    @property
    def mode(self) -> ModeChoice | None:
        return self._mode

    # -- AntDT: ranks --------------------------------------------------------------------------------

    def decide_ranks(self, now: float, *, cluster_pending_s: float = 0.0) -> list[StragglerDecision]:
        """KILL_RESTART persistent stragglers, ADJUST_BS for transient ones or a stale allocation."""
        report = self.ranks.report(now)
        out: list[StragglerDecision] = []
        killed = set()
        if self.cfg.kill_restart:
            for member in report.persistent:
                since = self._restarted.get(member)
                if since is not None and now - since < self.cfg.restart_cooldown_s:
                    continue
                if cluster_pending_s > self.cfg.restart_max_pending_s:
                    continue  # the cluster is busy: a replacement would wait longer than it saves
                ratio = report.members[member].long_ratio
                why = f"persistent straggler: long-window time {ratio:.2f}× the mean"
                out.append(KillRestart(now, member, "rank", why))
                self._restarted[member] = now
                self.ranks.forget(member)
                killed.add(member)
        adjust = self._adjust_batches(now, report, killed)
        if adjust is not None:
            out.append(adjust)
        return out or [NoAction(now, "no rank straggler and the batch split is balanced")]

    def _adjust_batches(self, now: float, report: DetectionReport, killed: set[str]) -> AdjustBatch | None:
        names = list(self._batch)
        rates = [self.ranks.throughput(m, now) if m not in killed else None for m in names]
        known = [r for r in rates if r is not None and r > 0]
        if not known:
            return None
        fill = float(np.mean(known))  # no estimate yet (new or restarted rank): assume an average one
        v = np.array([r if r is not None and r > 0 else fill for r in rates])
        bc = self.cfg.batch
        hi = min(bc.max_batch, self.global_batch)
        if bc.solver == "milp":
            new = allocate_milp(v, self.global_batch, bc.min_batch, hi, time_limit_s=bc.milp_time_limit_s)
        else:
            new = allocate_greedy(v, self.global_batch, bc.min_batch, hi)
        cur = np.array([self._batch[m] for m in names])
        if np.array_equal(new, cur):
            return None
        before, after = makespan(cur, v), makespan(new, v)
        transient = [m for m in report.transient if m not in killed]
        gain = 1.0 - after / before if before > 0 else 0.0
        if transient:
            reason = f"transient straggler(s) {', '.join(sorted(transient))}"
        elif gain > bc.rebalance_gain:
            reason = f"Eq. 3 predicts the slowest BPT {gain:.0%} lower"
        else:
            return None
        self._batch = {m: int(b) for m, b in zip(names, new, strict=True)}
        return AdjustBatch(now, dict(self._batch), after, before, reason)

    # -- STAR: sites ---------------------------------------------------------------------------------

    def decide_mode(
        self,
        now: float,
        predicted_s: Mapping[str, float] | None = None,
        *,
        child_s: Mapping[str, float] | None = None,
        link_costs: Mapping[tuple[str, str], float] | None = None,
    ) -> list[StragglerDecision]:
        """Choose bsp / x-order / parent–child (/ dynamic) by Eq. 1–3; emit decisions on a switch."""
        if predicted_s is None:
            report = self.sites.report(now)
            predicted_s = {s: st.short_s for s, st in report.members.items() if st.short_s is not None}
        if len(predicted_s) < 2:
            return [NoAction(now, "fewer than two sites with predicted iteration times")]
        names = sorted(predicted_s)
        times = [predicted_s[s] for s in names]
        child = None if child_s is None else [child_s.get(s, predicted_s[s]) for s in names]
        phi = self.noise.phi
        choice = choose_mode(times, phi, self.global_batch, self.cfg.mode, child_times=child)
        current = self._mode if self._site_names == names else None
        if current is None:
            current_time = evaluate_mode(_plain_bsp(len(names)), times, phi, self.global_batch, child)
            current_kind = "bsp"
        else:
            current_time = evaluate_mode(current, times, phi, self.global_batch, child)
            current_kind = current.kind
        if _same_mode(choice, current, len(names)):
            return [NoAction(now, f"mode {current_kind} is still the best (Eq. 1–3)")]
        # STAR §IV: without a predicted straggler SSGD is used, whatever the model says of the others
        calm = not predicted_stragglers(times, self.cfg.mode.straggler_ratio)
        if not calm and choice.time > current_time * (1.0 - self.cfg.mode.switch_gain):
            return [NoAction(now, f"{choice.kind} would gain less than switch_gain over {current_kind}")]
        self._mode, self._site_names = choice, names
        reason = (
            f"{current_kind} → {choice.kind}: predicted {current_time:.3g} → {choice.time:.3g} (φ={phi:.3g})"
        )
        out: list[StragglerDecision] = [
            self._mode_decision(now, choice, names, reason, predicted_s, link_costs)
        ]
        out.append(AdjustLr(now, self._mode_lr(choice, names), f"STAR §IV-C lr ∝ batch per update; {reason}"))
        return out

    def _mode_decision(
        self,
        now: float,
        choice: ModeChoice,
        names: list[str],
        reason: str,
        predicted_s: Mapping[str, float],
        link_costs: Mapping[tuple[str, str], float] | None,
    ) -> StragglerDecision:
        groups = tuple(tuple(names[i] for i in g) for g in choice.groups)
        if choice.kind == "parent_child":
            ring, kids = groups
            return ParentChild(
                now, ring, _attach(ring, kids, predicted_s, link_costs), choice.wait, choice.time, reason
            )
        assert choice.kind in ("bsp", "x_order", "dynamic")
        return BackupWorkers(now, choice.kind, choice.order, groups, choice.time, reason)

    def _mode_lr(self, choice: ModeChoice, names: list[str]) -> dict[str, float]:
        n = len(names)
        lr: dict[str, float] = {}
        if choice.kind == "dynamic":
            for g, y in zip(choice.groups, choice.reports, strict=True):
                lr.update({names[i]: scaled_lr(self.lr, y, n) for i in g})
        else:
            lr = dict.fromkeys(names, scaled_lr(self.lr, choice.reports[0], n))
        return lr

    def decide_tree(
        self,
        now: float,
        costs: Mapping[str, float],
        link_costs: Mapping[tuple[str, str], float] | None = None,
    ) -> list[StragglerDecision]:
        """Rebuild the STAR §IV-D2 tree when the sites' costs change its shape."""
        parents = latency_tree(costs, self.cfg.tree_arity, link_costs)
        if parents == self._tree:
            return [NoAction(now, "tree unchanged")]
        self._tree = parents
        ranked = tuple(sorted(((s, float(c)) for s, c in costs.items()), key=lambda x: (x[1], x[0])))
        return [TreeRebuild(now, parents, ranked, self.cfg.tree_arity, "site costs reorder the tree")]

    # -- everything ----------------------------------------------------------------------------------

    def decide(
        self,
        now: float,
        *,
        predicted_s: Mapping[str, float] | None = None,
        child_s: Mapping[str, float] | None = None,
        costs: Mapping[str, float] | None = None,
        link_costs: Mapping[tuple[str, str], float] | None = None,
        cluster_pending_s: float = 0.0,
    ) -> list[StragglerDecision]:
        """One Controller round: ranks, sites' mode, tree, and the WAN-wide check; NONEs dropped unless
        nothing else was decided."""
        links = self.links.report(now)
        out = list(self.decide_ranks(now, cluster_pending_s=cluster_pending_s))
        if self.sites.members or predicted_s is not None:
            out += self.decide_mode(now, predicted_s, child_s=child_s, link_costs=link_costs)
        if costs:
            out += self.decide_tree(now, costs, link_costs)
        acted: list[StragglerDecision] = [d for d in out if not isinstance(d, NoAction)]
        if links.all_slow:
            acted.append(NoAction(now, _wan_reason(links)))
        if acted:
            return acted
        return [NoAction(now, "; ".join(d.reason for d in out if isinstance(d, NoAction)))]


def _wan_reason(links: LinkReport) -> str:
    return (
        f"all links slow ({len(links.slow_links)} at ≥ λ× their own past): a WAN-wide slowdown, "
        "left to the bandwidth estimator"
    )


def _plain_bsp(n: int) -> ModeChoice:
    return ModeChoice("bsp", 0.0, n, 0.0, (tuple(range(n)),), (float(n),))


def _same_mode(a: ModeChoice, b: ModeChoice | None, n: int) -> bool:
    b = b or _plain_bsp(n)
    if a.kind != b.kind:
        return False
    if a.kind in ("bsp", "x_order"):
        return a.order == b.order
    return a.groups == b.groups and a.wait == b.wait


def _attach(
    ring: Sequence[str],
    kids: Sequence[str],
    predicted_s: Mapping[str, float],
    link_costs: Mapping[tuple[str, str], float] | None,
) -> dict[str, str]:
    """STAR §IV-D1/D2: each child takes the ring member with the fewest children, then the cheapest link
    (the fastest member when link costs are unknown)."""
    load = dict.fromkeys(ring, 0)
    lc = link_costs or {}

    def cost(p: str, c: str) -> float:
        return lc.get((p, c), lc.get((c, p), predicted_s[p]))

    parents = {}
    for c in sorted(kids, key=lambda k: (predicted_s[k], k)):
        p = min(ring, key=lambda r: (load[r], cost(r, c), r))
        load[p] += 1
        parents[c] = p
    return parents
