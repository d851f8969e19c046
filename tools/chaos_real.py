"""The chaos soak with real clients (``tools/chaos_soak.py --real-clients``, issue 21): trainers that use the
public client (torch, ``wanrt.init``, ``wanrt.SparseOptimizer`` with Adam: tools/real_trainer.py), two
sites as ``wanrt job init`` writes them, a scheduler and a gateway per site (tools/real_job.py), and a
seeded schedule of what users and machines do to such a job: a trainer killed with SIGKILL and launched
again at once (a torchrun restart) or after a while, a gateway killed (SIGKILL) or stopped (SIGTERM) and
started again; at the end a second run of the same command against the gateways (another run: refused).

Why beside the protocol stand-ins' soak (tools/chaos_soak.py): the stand-ins check the gateways'
accounting under many faults; only real trainers show what a user sees — whether a restarted trainer
gets back in, how long the healthy site waits, how the loss moves after a gateway restart.

Keys (:func:`run`'s report is a flat dict, so other key groups — the mistakes and attacks probes — can
be merged into it; docs/chaos.md):

* ``pushes_lost`` / ``pushes_double_counted`` — of the trainer pushes the gateways took (their rounds
  logs, tools/chaos_real_gateway.py), those counted in no delivered result / in more than one;
* ``ranks_identical_at_end`` — 1 when every site ended with the same parameter digest;
* ``trainer_rejoin_s`` — worst, over trainer kills, from the kill to the new process's first step that
  counts (its snapshot installed, its gradients in the rounds again), minus the time the soak kept it down;
* ``healthy_site_stall_s`` — worst, over every event, of the other site's longest gap between two
  iterations while the event lasted, minus its median gap;
* ``gateway_restart_loss_jump`` — worst, over gateway restarts, of the mean held-out loss (a fixed batch,
  both sites) over the ``LOSS_WINDOW`` iterations after the restarted site counts again, over the mean of
  the ``LOSS_WINDOW`` before the kill;
* ``foreign_run_refused`` / ``foreign_run_refused_s`` — the second run was refused at ``wanrt.init``
  (RunRefused, one traceback), and how long it took.
"""

from __future__ import annotations

import itertools
import json
import random
import signal
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.real_job import RealJob

__all__ = ["REAL_TARGETS", "RealPlan", "account", "full_real_plan", "quick_real_plan", "run"]

#: iterations averaged for the loss before a gateway kill and after the site counts again
LOSS_WINDOW = 20

#: key -> (comparison, target), as tools/chaos_soak.py prints them
REAL_TARGETS: dict[str, tuple[str, float]] = {
    "pushes_lost": ("==", 0),
    "pushes_double_counted": ("==", 0),
    "ranks_identical_at_end": ("==", 1),
    "trainer_rejoin_s": ("<=", 10.0),
    "healthy_site_stall_s": ("<=", 5.0),
    "gateway_restart_loss_jump": ("<=", 1.1),
    "foreign_run_refused": ("==", 1),
}

EVENTS = ("trainer_restart", "trainer_down", "gateway_kill", "gateway_term")


@dataclass(frozen=True)
class RealPlan:
    seed: int
    rounds_of_events: int  # each round holds every event once, in a seeded order
    steps: int
    compute_s: float  # the trainers' pause per iteration (a larger model's compute)
    settle_its: int  # iterations both sites train between two events
    down_s: float = 3.0  # how long ``trainer_down`` keeps the trainer dead


def quick_real_plan(seed: int) -> RealPlan:
    return RealPlan(seed, 1, 700, 0.08, 60)


def full_real_plan(seed: int) -> RealPlan:
    return RealPlan(seed, 4, 3000, 0.08, 80)


@dataclass
class EventRow:
    n: int
    kind: str
    site: str
    at_iteration: int
    rejoin_s: float | None = None
    stall_s: float | None = None
    loss_jump: float | None = None
    discarded: int = 0
    note: str = ""


@dataclass
class _Soak:
    plan: RealPlan
    job: RealJob
    args: list[str]
    rows: list[EventRow] = field(default_factory=list)

    def schedule(self) -> list[tuple[str, str]]:
        rng = random.Random(self.plan.seed)
        out = []
        for _ in range(self.plan.rounds_of_events):
            kinds = list(EVENTS)
            rng.shuffle(kinds)
            out += [(k, rng.choice(self.job.sites)) for k in kinds]
        return out

    def newest(self, site: str) -> int:
        recs = self.job.records(site)
        return recs[-1]["it"] if recs else -1

    def wait_all(self, iteration: int, timeout_s: float = 120.0) -> bool:
        return all(self.job.wait_iteration(s, iteration, timeout_s) for s in self.job.sites)

    def counting_again(
        self, site: str, since: float, after_it: int, timeout_s: float = 90.0
    ) -> dict[str, Any] | None:
        """The site's first record after ``since``, past iteration ``after_it`` + 1, of a step whose
        gradients count (not discarded) after its last discarded one, once three more counted steps
        followed it (so a discard run that had not begun yet is not missed)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            recs = [r for r in self.job.records(site) if r["t"] > since]
            last_discard = max((i for i, r in enumerate(recs) if r["discarded"]), default=-1)
            counted = [r for r in recs[last_discard + 1 :] if r["it"] > after_it + 1]
            if len(counted) >= 4:
                return counted[0]
            time.sleep(0.1)
        return None

    def stall(self, site: str, t0: float, t1: float) -> float:
        """The longest gap between two iterations of ``site`` within [t0, t1], minus its median gap."""
        ts = [r["t"] for r in self.job.records(site)]
        gaps = [b - a for a, b in itertools.pairwise(ts)]
        median = statistics.median(gaps) if gaps else 0.0
        inside = [b - a for a, b in itertools.pairwise(ts) if b >= t0 and a <= t1]
        return max(0.0, max(inside, default=0.0) - median)

    def loss_mean(self, first: int, last: int) -> float | None:
        """Mean held-out loss (a fixed batch: a function of the parameters alone) over both sites."""
        vals = [r["eval"] for s in self.job.sites for r in self.job.records(s) if first <= r["it"] <= last]
        return statistics.fmean(vals) if vals else None

    def trainer_event(self, row: EventRow, down_s: float) -> None:
        other = next(s for s in self.job.sites if s != row.site)
        at = self.newest(row.site)
        t_kill = self.job.kill_trainer(row.site)
        if down_s:
            time.sleep(down_s)
        self.job.start_trainer(row.site, *self.args)
        back = self.counting_again(row.site, t_kill, at)
        if back is None:
            row.note = "never counted again"
            return
        row.rejoin_s = round(back["t"] - t_kill - down_s, 2)
        row.stall_s = round(self.stall(other, t_kill, back["t"]), 2)
        row.discarded = sum(1 for r in self.job.records(row.site) if r["t"] > t_kill and r["discarded"])

    def gateway_event(self, row: EventRow, sig: int) -> None:
        other = next(s for s in self.job.sites if s != row.site)
        before = self.newest(row.site)
        t_kill = time.time()
        self.job.stop_gateway(row.site, sig)
        self.job.start_gateway(row.site)
        back = self.counting_again(row.site, t_kill, before)
        if back is None:
            row.note = "never counted again"
            return
        row.stall_s = round(self.stall(other, t_kill, back["t"]), 2)
        row.rejoin_s = round(back["t"] - t_kill, 2)
        row.discarded = sum(1 for r in self.job.records(row.site) if r["t"] > t_kill and r["discarded"])
        self.wait_all(back["it"] + LOSS_WINDOW)
        pre = self.loss_mean(before - LOSS_WINDOW, before)
        post = self.loss_mean(back["it"], back["it"] + LOSS_WINDOW)
        if pre and post is not None:
            row.loss_jump = round(post / pre, 3)

    def run_events(self) -> None:
        for n, (kind, site) in enumerate(self.schedule(), 1):
            start = max(self.newest(s) for s in self.job.sites)
            if not self.wait_all(start + self.plan.settle_its):
                raise RuntimeError(f"the job stopped before event {n}: see {self.job.root}")
            row = EventRow(n, kind, site, self.newest(site))
            if kind == "trainer_restart":
                self.trainer_event(row, 0.0)
            elif kind == "trainer_down":
                self.trainer_event(row, self.plan.down_s)
            elif kind == "gateway_kill":
                self.gateway_event(row, signal.SIGKILL)
            else:
                self.gateway_event(row, signal.SIGTERM)
            self.rows.append(row)
            print(_row_text(row), flush=True)


def _row_text(r: EventRow) -> str:
    def f(v: float | None) -> str:
        return "-" if v is None else f"{v:g}"

    return (
        f"  {r.n:>2} {r.kind:<16} {r.site:<4} {r.at_iteration:>6} {f(r.rejoin_s):>9} {f(r.stall_s):>8} "
        f"{f(r.loss_jump):>9} {r.discarded:>9}  {r.note}"
    )


def account(root: Path, sites: tuple[str, ...], upto: int) -> dict[str, int]:
    """From the gateways' rounds logs: every push a gateway took, for iterations below ``upto`` (later
    rounds may not have settled when the job ended), must be counted exactly once in the results the job
    keeps; and results of one round delivered at several sites (or twice) must name the same contributions.

    What the job keeps. A gateway killed after it made a round's result but before its own contribution
    left its send queue delivered that result to its trainer alone: no other site ever gets it, and once
    the fresh gateway rejoins, the others settle that round without this site and carry their own
    contributions into the rounds from the join (``RoundEngine.fresh_peer_joined``), while the site's
    trainer re-sends its unacknowledged push (folded into a later one) and fetches the job's parameters
    by a resync. Such an *orphan* result (delivered at one site only, by a gateway life that ended) is in
    no site's parameters, so it is not counted: counted, it listed the other site's push a second time
    (``pushes_double_counted`` 1 in one CI run of tests/tools/test_chaos_real.py; the interleaving is
    forced in tests/gateways/rounds/test_engine.py, ``test_a_result_only_a_killed_gateway_made_...``).
    A gateway life starts with a ``start`` line (tools/chaos_real_gateway.py).

    Folded pushes (a re-sent push the restarted gateway folded into a later one, its *carrier*) count
    once per time they were folded plus any result that names them: a push folded twice, or counted in a
    result and folded as well, is double counted."""
    lives = dict.fromkeys(sites, 0)
    deliveries: dict[tuple[int, int], list[tuple[str, int, tuple[tuple[str, int], ...], list[Any]]]] = {}
    pushes: set[tuple[str, int, int]] = set()
    # folded push -> carrier -> times folded into it (the push line and its deliver line may both name
    # the same fold: the larger count of the two, not their sum)
    folded: dict[tuple[str, int, int], dict[tuple[str, int, int], int]] = {}

    def fold(site: str, layer: int, pairs: list[tuple[int, int]]) -> None:
        per: dict[tuple[tuple[str, int, int], tuple[str, int, int]], int] = {}
        for carrier, old in pairs:
            k = ((site, old, layer), (site, carrier, layer))
            per[k] = per.get(k, 0) + 1
        for (old_key, carrier_key), n in per.items():
            into = folded.setdefault(old_key, {})
            into[carrier_key] = max(into.get(carrier_key, 0), n)

    for site in sites:
        path = root / f"rounds-{site}.jsonl"
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # the last line of a killed gateway
            if rec["k"] == "start":
                lives[site] += 1
            elif rec["k"] == "push":
                pushes.add((site, rec["it"], rec["layer"]))
                fold(site, rec["layer"], [(rec["it"], old) for old in rec.get("covers", ())])
            elif rec["k"] == "deliver":
                ids = tuple(sorted((s, i) for s, i in rec["ids"]))
                entry = (site, lives[site], ids, rec.get("covers", []))
                deliveries.setdefault((rec["it"], rec["layer"]), []).append(entry)
    conflicts = 0
    counted: dict[tuple[str, int, int], int] = {}
    for (_, layer), entries in deliveries.items():
        at_sites = {site for site, *_ in entries}
        if len(at_sites) == 1 and all(life < lives[site] for site, life, *_ in entries):
            continue  # an orphan: see above
        ids = entries[0][2]
        conflicts += sum(1 for e in entries[1:] if e[2] != ids)
        for s, i in ids:
            counted[(s, i, layer)] = counted.get((s, i, layer), 0) + 1
        for site, _, _, covers in entries:
            # a push's own line may name no covers: its result was delivered while the gateway took it
            fold(site, layer, [(it, old) for it, old in covers])
    for old, carriers in folded.items():
        counted[old] = counted.get(old, 0) + sum(counted.get(c, 0) * n for c, n in carriers.items())
    considered = [p for p in pushes if p[1] < upto]
    return {
        "pushes": len(considered),
        "pushes_lost": sum(1 for p in considered if counted.get(p, 0) == 0),
        "pushes_double_counted": sum(1 for p in considered if counted.get(p, 0) > 1),
        "result_conflicts": conflicts,
    }


def run(plan: RealPlan, root: Path, *, quick: bool) -> dict[str, Any]:
    """One soak in ``root``; returns the report (flat: other key groups merge into it)."""
    args = ["--steps", str(plan.steps), "--compute-s", str(plan.compute_s), "--deadline-s", "60"]
    print("   # event            site   iter  rejoin_s  stall_s loss_jump discarded  note", flush=True)
    with RealJob(root, scheduler=True, rounds_logs=True) as job:
        job.start_gateways()
        for site in job.sites:
            job.start_trainer(site, *args)
        soak = _Soak(plan, job, args)
        soak.run_events()
        codes = job.wait_trainers(plan.steps * (plan.compute_s + 0.2) + 120)
        results = {s: job.result(s) for s in job.sites}
        digests = {r["digest"] for r in results.values() if r is not None}
        identical = int(len(digests) == 1 and all(results.values()) and all(c == 0 for c in codes.values()))
        # a second run of the same command: the job's run finished there, so it is another run
        before = len(job.trainer_log("a"))
        t0 = time.monotonic()
        proc = job.start_trainer("a", *args)
        code = proc.wait(120)
        refused_s = time.monotonic() - t0
        text = job.trainer_log("a")[before:]
        refused = int(code != 0 and "RunRefused" in text and text.count("Traceback") == 1)
        for site in job.sites:
            job.stop_gateway(site)
        acc = account(root, job.sites, plan.steps - 2)
    rows = soak.rows

    def worst(attr: str, kinds: tuple[str, ...]) -> float | None:
        vals = [getattr(r, attr) for r in rows if r.kind in kinds and getattr(r, attr) is not None]
        return max(vals) if vals else None

    missing = [r for r in rows if r.rejoin_s is None]
    report: dict[str, Any] = {
        "quick": quick,
        "seed": plan.seed,
        "events": len(rows),
        "events_never_recovered": len(missing),
        **acc,
        "ranks_identical_at_end": identical,
        "trainer_rejoin_s": worst("rejoin_s", ("trainer_restart", "trainer_down")),
        "healthy_site_stall_s": worst("stall_s", EVENTS),
        "gateway_restart_loss_jump": worst("loss_jump", ("gateway_kill", "gateway_term")),
        "gateway_restart_back_s": worst("rejoin_s", ("gateway_kill", "gateway_term")),
        "discarded_steps_worst": max((r.discarded for r in rows), default=0),
        "foreign_run_refused": refused,
        "foreign_run_refused_s": round(refused_s, 2),
        "exit_codes": codes,
        "rows": [r.__dict__ for r in rows],
    }
    return report


def meets(key: str, value: Any) -> bool:
    op, target = REAL_TARGETS[key]
    if value is None:
        return False
    return bool(value == target if op == "==" else value <= target)
