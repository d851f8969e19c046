#!/usr/bin/env python3
"""STAR §IV-D2's latency tree, live: a binary tree in name order against the same job with the scheduler's
tree policy in the loop, in the discrete-event simulator of whole gateway nodes (sims/des).

Per case (5 or 7 sites, one site's links ``slowdown`` × slower than the others'), two simulations of the
same scenario and seed run side by side:

* **name order** — the gateways' configured tree (root = the first name, levels filled by name);
* **policy** — :class:`~sims.des.scheduled.ScheduledSimulation`: every ``report_s`` the gateways' own
  telemetry (``GatewayNode.telemetry``: per-link busy bytes/seconds, frontier) goes to
  :class:`~scheduler.stragglers.daemon_policy.SiteStragglerPolicy` with ``modes = ["latency_tree"]``; what it
  announces (``site_costs``) is committed to every gateway at one effective iteration.

``*_round_ratio`` = mean time of a synchronous round — one iteration of every layer, the gap between
consecutive iteration starts the trainers see (staleness 0: an iteration starts when the previous one's
aggregates arrived) — of the name-order run over the policy run, over the iterations from the policy's
effective iteration + 2 on (the same iterations in both runs). Expected > 1 where name order puts the slow
site at the root or an interior node, ≈ 1 where it is already a leaf (the policy must then stay silent).
``*_layer_ratio`` is the same for one layer's round (its first push anywhere → its aggregate delivered
everywhere; layers overlap, so it is not a part of the former). Every key is computed in the run.

The links are the simulator's: one model per site pair (no shared access link), so an interior slow site
hurts by sitting twice on the critical path (its children's partials up, the finals down), not by
sharing its capacity among children: a shared uplink would make the interior case worse still.

``--quick`` runs the 5-site cases with fewer iterations (< 60 s); ``--json PATH`` writes every key.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateways.rounds.config import RoundConfig
from scheduler.stragglers.daemon_policy import SiteStragglerPolicy
from scheduler.stragglers.site_config import SiteStragglerConfig
from scheduler.stragglers.tree import tree_depths
from sims.des.results import SimResult
from sims.des.scenario import ComputeSpec, GatewaySpec, LinkOverride, LinkSpec, PayloadSpec, Scenario
from sims.des.scheduled import ScheduledSimulation
from sims.des.world import Simulation
from wanrt.protocol.job_settings import JobSettings, PlanSettings, format_site_costs

NAMES = "abcdefg"


@dataclass(frozen=True)
class Case:
    key: str
    sites: int
    slow: str
    where: str  # where name order puts the slow site


CASES_FULL = (
    Case("latency_tree_round_ratio", 5, "b", "interior"),
    Case("latency_tree_round_ratio_root", 5, "a", "root"),
    Case("latency_tree_leaf_ratio", 5, "e", "leaf"),
    Case("latency_tree_round_ratio_7", 7, "b", "interior"),
    Case("latency_tree_leaf_ratio_7", 7, "g", "leaf"),
    # root + 2 leaves: every payload link touches the root, so nothing tells a slow root from two slow
    # leaves; the policy must stay silent (no gain, no harm)
    Case("latency_tree_root_ratio_3", 3, "a", "ambiguous"),
)
CASES_QUICK = (*CASES_FULL[:3], CASES_FULL[5])


def scenario(case: Case, iterations: int, rate_bps: float, slowdown: float, seed: int) -> Scenario:
    names = tuple(NAMES[: case.sites])
    slow = tuple(
        LinkOverride(rate_bps=rate_bps / slowdown, delay_s=0.01, jitter_s=0.002, a=case.slow, b=o)
        for o in names
        if o != case.slow
    )
    rounds = RoundConfig(topology="tree", round_deadline_s=120.0, t_w_s=120.0, suspect_after_s=120.0)
    return Scenario(
        name=f"latency-tree-{case.sites}-{case.slow}",
        seed=seed,
        names=names,
        iterations=iterations,
        sample_interval_s=0.0,
        payload=PayloadSpec(layers=4, dense_len=65536, density=0.05),
        compute=ComputeSpec(model="normal", mean_s=0.05, sd_s=0.01, backward_fraction=0.5),
        network=LinkSpec(rate_bps=rate_bps, delay_s=0.01, jitter_s=0.002),
        links=slow,
        gateway=GatewaySpec(link_rate_bps=rate_bps, rounds=rounds),
    )


def _round_times(r: SimResult, first: int) -> list[float]:
    return [
        r.last_delivery[k] - r.first_push[k]
        for k in sorted(r.first_push)
        if k[0] >= first and k in r.last_delivery
    ]


def _iter_times(r: SimResult, first: int) -> list[float]:
    return r.iteration_times()[first:]


def _digests_agree(r: SimResult) -> bool:
    by_round: dict[tuple[int, int], set[str]] = {}
    for (_, it, layer), (_, digest, *_rest) in r.aggregates.items():
        by_round.setdefault((it, layer), set()).add(digest)
    return bool(by_round) and all(len(v) == 1 for v in by_round.values())


class _Oracle:
    """Announces the scenario's true order once (the slow site the most expensive): what the 3-site case
    leaves on the table. Reads the scenario, not telemetry — labelled oracle, never the policy's result."""

    def __init__(self, sites: tuple[str, ...], slow: str, slowdown: float) -> None:
        self.costs = {s: slowdown if s == slow else 1.0 for s in sites}
        self.done = False

    def observe(self, site: str, metrics: Mapping[str, float], now: float) -> None:
        pass

    def decide(self, now: float) -> JobSettings | None:
        if self.done:
            return None
        self.done = True
        return JobSettings(plan=PlanSettings(site_costs=self.costs))

    def committed(self, values: JobSettings, effective_iteration: int) -> None:
        pass


def run_case(case: Case, iterations: int, rate_bps: float, slowdown: float, seed: int) -> dict[str, Any]:
    sc = scenario(case, iterations, rate_bps, slowdown, seed)
    base = Simulation(sc).run()
    policy = SiteStragglerPolicy(sc.site_names(), SiteStragglerConfig(modes=("latency_tree",)))
    live_sim = ScheduledSimulation(sc, policy, report_s=0.5)
    live = live_sim.run()
    commits = live_sim.commits
    first = commits[0].effective_iteration + 2 if commits else iterations // 3
    out: dict[str, Any] = {
        "sites": case.sites,
        "slow": case.slow,
        "name_order_place": case.where,
        "finished": base.finished and live.finished,
        "problems": base.problems + live.problems,
        "announcements": len(commits),
        "from_iteration": first,
        "digests_agree": _digests_agree(live) and _digests_agree(base),
    }
    rt_base, rt_live = _round_times(base, first), _round_times(live, first)
    it_base, it_live = _iter_times(base, first), _iter_times(live, first)
    out["layer_s_name_order"] = statistics.fmean(rt_base)
    out["layer_s_policy"] = statistics.fmean(rt_live)
    out["layer_ratio"] = out["layer_s_name_order"] / out["layer_s_policy"]
    out["round_s_name_order"] = statistics.fmean(it_base)
    out["round_s_policy"] = statistics.fmean(it_live)
    out["round_ratio"] = out["round_s_name_order"] / out["round_s_policy"]
    if commits:
        costs = dict(commits[-1].values.plan.site_costs or {})
        text = format_site_costs(costs)  # the policy's canonical string, as announced
        parents = policy.tree.running if policy.tree is not None else None
        assert parents is not None
        depth = tree_depths(parents)
        out["site_costs"] = text
        out["root"] = next(s for s, p in parents.items() if p is None)
        out["slow_is_leaf"] = all(p != case.slow for p in parents.values())
        out["slow_depth"] = depth[case.slow]
        out["slow_cost_over_median"] = costs[case.slow] / statistics.median(costs.values())
        out["decided_at_s"] = commits[0].at
        # every gateway runs the announced tree from the effective iteration on
        eff = commits[0].effective_iteration
        plans = {n.engine.plan_for(eff).plan_id for n in live_sim.nodes.values() if n.engine is not None}
        out["gateways_agree_on_plan"] = len(plans) == 1
    else:
        out["slow_is_leaf"] = all(p != case.slow for _, p in live_sim.plan.parents)
        out["gateways_agree_on_plan"] = True
    if case.where == "ambiguous":
        oracle_sim = ScheduledSimulation(sc, _Oracle(sc.site_names(), case.slow, slowdown), report_s=0.5)
        oracle = oracle_sim.run()
        o_first = oracle_sim.commits[0].effective_iteration + 2
        out["oracle_round_ratio"] = statistics.fmean(_iter_times(base, o_first)) / statistics.fmean(
            _iter_times(oracle, o_first)
        )
    last = policy.tree.last if policy.tree is not None else None
    if last is not None:
        out["last_check"] = {"running_s": last.running_s, "proposed_s": last.proposed_s}
    return out


def measure(quick: bool, seed: int = 1) -> dict[str, Any]:
    """Every key of this benchmark (bench_stragglers.py includes them as its part 7)."""
    cases = CASES_QUICK if quick else CASES_FULL
    iterations = 30 if quick else 80
    rate, slowdown = 20e6, 5.0
    out: dict[str, Any] = {"latency_tree_rate_bps": rate, "latency_tree_slowdown": slowdown}
    detail: dict[str, Any] = {}
    for case in cases:
        r = run_case(case, iterations, rate, slowdown, seed)
        detail[case.key] = r
        out[case.key] = r["round_ratio"]
        if "oracle_round_ratio" in r:
            out[case.key + "_oracle"] = r["oracle_round_ratio"]
        out[case.key.replace("round_ratio", "layer_ratio").replace("leaf_ratio", "leaf_layer_ratio")] = r[
            "layer_ratio"
        ]
    moved = [c for c in cases if c.where in ("root", "interior")]
    kept = [c for c in cases if c.where in ("leaf", "ambiguous")]
    # the slow site ends a leaf wherever that is decidable (not in the 3-site case, by construction)
    decidable = [c for c in cases if c.where != "ambiguous"]
    out["latency_tree_slow_site_leaf"] = int(all(detail[c.key]["slow_is_leaf"] for c in decidable))
    out["latency_tree_announcements_moved"] = max(detail[c.key]["announcements"] for c in moved)
    out["latency_tree_announcements_leaf"] = max(detail[c.key]["announcements"] for c in kept)
    out["latency_tree_digests_agree"] = int(all(detail[c.key]["digests_agree"] for c in cases))
    out["latency_tree_gateways_agree"] = int(all(detail[c.key]["gateways_agree_on_plan"] for c in cases))
    out["latency_tree_finished"] = int(all(detail[c.key]["finished"] for c in cases))
    out["latency_tree_cases"] = detail
    return out


TARGETS = {
    "latency_tree_round_ratio": lambda v: v > 1.1,
    "latency_tree_round_ratio_root": lambda v: v > 1.0,
    "latency_tree_leaf_ratio": lambda v: 0.95 <= v <= 1.05,
    "latency_tree_round_ratio_7": lambda v: v > 1.1,
    "latency_tree_leaf_ratio_7": lambda v: 0.95 <= v <= 1.05,
    "latency_tree_root_ratio_3": lambda v: 0.95 <= v <= 1.05,
    "latency_tree_slow_site_leaf": lambda v: v == 1,
    "latency_tree_announcements_moved": lambda v: v == 1,
    "latency_tree_announcements_leaf": lambda v: v == 0,
    "latency_tree_digests_agree": lambda v: v == 1,
    "latency_tree_gateways_agree": lambda v: v == 1,
}


def table(out: dict[str, Any]) -> str:
    lines = [
        f"{'case':<34} {'round s name':>12} {'round s pol':>11} {'ratio':>6} {'layer ratio':>11} "
        f"{'ann':>3} {'root':>4} {'slow leaf':>9}  site_costs"
    ]
    for key, r in out["latency_tree_cases"].items():
        lines.append(
            f"{key:<34} {r['round_s_name_order']:>12.3f} {r['round_s_policy']:>11.3f} "
            f"{r['round_ratio']:>6.2f} {r['layer_ratio']:>11.2f} {r['announcements']:>3} "
            f"{r.get('root', '-'):>4} {r['slow_is_leaf']!s:>9}  {r.get('site_costs', '-')}"
        )
    for key, r in out["latency_tree_cases"].items():
        if "oracle_round_ratio" in r:
            lines.append(
                f"{key}_oracle (true order announced, not measured): ratio {r['oracle_round_ratio']:.2f}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="5-site cases, 30 iterations (< 60 s)")
    ap.add_argument("--json", metavar="PATH", help="write every key as JSON")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    out = measure(args.quick)
    out["mode"] = "quick" if args.quick else "full"
    out["elapsed_s"] = time.perf_counter() - t0
    print(table(out))
    report_keys(out, TARGETS, args.json)
    return 0


def report_keys(out: Mapping[str, Any], targets: Mapping[str, Any], json_path: str | None) -> None:
    """Each key against its target (also bench_stragglers.py's table), the elapsed time, the JSON."""
    print(f"\n{'key':<38} {'value':>10}  target")
    for key, ok in targets.items():
        v = out.get(key)
        if v is None:
            why = "not measured in this mode" if key not in out else "a run missed its target loss"
            print(f"{key:<38} {'—':>10}  {why}")
            continue
        print(f"{key:<38} {v:>10.4g}  {'met' if ok(v) else 'NOT met'}")
    print(f"elapsed {out['elapsed_s']:.1f} s ({out['mode']})")
    if json_path:
        Path(json_path).write_text(json.dumps(out, indent=1, default=float))


if __name__ == "__main__":
    sys.exit(main())
