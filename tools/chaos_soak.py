"""Chaos soak (issue 11): six real gateway daemons and their trainers on shaped links, through a seeded
schedule of gateway kills and restarts (one and two at a time), trainer kills, link partitions, bandwidth
drops, a malicious peer holding the job secret, and unauthenticated control requests; then the accounting.

Why a soak and not more unit tests: each fault has its own test (tests/gateways/service/test_restart.py,
test_bad_peers.py, test_refusals.py, test_daemon.py); what they cannot show is whether the faults still
hold their guarantees *together*, one after the other on the same job, and what a trainer experiences
meanwhile (how long it waits with no news, how long a restarted site takes to be back in rounds, whether
memory grows). DESIGN.md: "Nothing is lost on the way" and "Trust" are what the safety keys check.

Usage::

    python tools/chaos_soak.py --quick --json /tmp/chaos.json          # < 60 s
    python tools/chaos_soak.py --seed 3                                # the full soak, < 15 min

Keys written (see docs/chaos.md for how each is measured): pushes_lost, pushes_double_counted,
ranks_identical_at_end, stuck_rounds, rss_growth_mb, max_silent_wait_s, forged_accepted,
unauthenticated_changes_accepted, resync_s, plus diagnostics.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import itertools
import json
import logging
import os
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

if __package__ in (None, ""):  # `python tools/chaos_soak.py` from the worktree root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from gateways.node.resync import ResyncStats
from gateways.rounds.config import RoundConfig
from gateways.service.peer_links import MAX_PREAUTH_PER_HOST
from tools.chaos_cluster import (
    CONTROL_TOKEN,
    JOB,
    LOG_SITE,
    SECRET,
    Accounting,
    SoakCluster,
    grow_count,
    soak_configs,
)
from tools.chaos_memory import MemoryTrace, print_report, rss_after_trim_mb, rss_mb
from tools.chaos_peer import MaliciousPeer, finite_payload, nan_payload
from tools.chaos_trainer import ChaosTrainer, layer_shape, make_payload
from transports.urls import short_socket_dir
from wanrt.errors import WanrtError

SITES = "abcdef"
EVENT_KINDS = ("kill1", "kill2", "trainer_kill", "partition", "bw_drop", "malicious", "control")
#: a forged value far outside what the trainers push (|v| <= 4 per site): seen in a result = accepted
FORGED_MAGNITUDE = 500.0


@dataclass(frozen=True)
class SoakPlan:
    """Sizes of one soak; ``--quick`` is the same soak with fewer events and iterations."""

    seed: int
    rounds_of_events: int  # each round holds every event kind once, in a seeded order
    layers: int
    compute_s: float  # the trainers' pause per iteration (a run lasts as long as the schedule)
    down_s: tuple[float, float]  # how long a killed gateway/trainer stays down
    fault_s: tuple[float, float]  # how long a partition or bandwidth drop lasts
    settle_s: float  # between events
    rate_bps: float = 50e6
    drop_bps: float = 1e6
    delay_s: float = 0.01
    final_wait_s: float = 60.0
    skip: tuple[str, ...] = ()  # event kinds left out (to tell which fault a regression comes from)


def quick_plan(seed: int) -> SoakPlan:
    return SoakPlan(seed, 1, 3, 0.05, (1.0, 2.0), (1.5, 2.5), 1.0, final_wait_s=20.0)


def full_plan(seed: int) -> SoakPlan:
    return SoakPlan(seed, 5, 4, 0.05, (1.0, 5.0), (2.0, 6.0), 3.0)


@dataclass
class EventRow:
    n: int
    kind: str
    sites: str
    started_s: float
    took_s: float
    resync_s: float | None = None
    forged_accepted: int = 0
    note: str = ""


def schedule(plan: SoakPlan) -> list[tuple[str, str, float]]:
    """(kind, sites, duration) per event, from ``plan.seed`` only."""
    rng = random.Random(plan.seed)
    out = []
    for _ in range(plan.rounds_of_events):
        kinds = list(EVENT_KINDS)
        rng.shuffle(kinds)
        for kind in kinds:
            if kind in plan.skip:
                continue
            n = 2 if kind in ("kill2", "partition", "bw_drop") else 1
            # the impersonated site must have a larger-named site to dial (the smaller name dials)
            pool = SITES[:-1] if kind == "malicious" else SITES
            sites = "".join(sorted(rng.sample(pool, n)))
            lo, hi = plan.fault_s if kind in ("partition", "bw_drop") else plan.down_s
            out.append((kind, sites, round(rng.uniform(lo, hi), 2)))
    return out


class Soak:
    def __init__(self, plan: SoakPlan, sock_dir: Path, *, trace: MemoryTrace | None = None) -> None:
        self.plan = plan
        self.trace = trace  # --trace-memory: what grew between the two RSS readings
        self.rounds = RoundConfig(topology="tree", round_deadline_s=3.0, suspect_after_s=3.0)
        self.configs = soak_configs(
            sock_dir,
            SITES,
            rate_bps=plan.rate_bps,
            delay_s=plan.delay_s,
            rounds=self.rounds,
            control_site="a",
        )
        self.cluster = SoakCluster(self.configs, Accounting(plan.layers, lambda layer: layer_shape(layer)[0]))
        self.trainers = {
            s: ChaosTrainer(
                cfg.trainer_listen,
                s,
                JOB,
                SECRET.encode(),
                layers=plan.layers,
                iterations=1 << 30,
                compute_s=plan.compute_s,
            )
            for s, cfg in self.configs.items()
        }
        self.rows: list[EventRow] = []
        self.resyncs: list[float] = []
        self.resync_missing = 0
        # (site, restarted at, that generation's resync counters): the counters, not the daemon — a record
        # holding each generation kept 20 dead gateways' engines, ledgers and links alive, counted as RSS
        self.restarts: list[tuple[str, float, ResyncStats]] = []
        self.forged = 0
        self.unauth_accepted = 0
        self.auth_change_applied = 0
        self.trainer_restarts = 0
        self.t0 = 0.0

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def harness_record_bytes(self) -> int:
        """Bytes of the soak's own records that grow with iterations (the rest of its state is bounded:
        the accounting's open rounds, SETTLE_LAG iterations)."""
        n = 0
        for t in self.trainers.values():
            n += sum(f.nbytes for f in t.fingerprints) + sum(len(f) for f in t.pushed_flags)
            n += t.event_times.buffer_info()[1] * t.event_times.itemsize
        acc = self.cluster.accounting
        n += sum(a.nbytes for a in acc.settled) + sum(len(c) for c in acc.counts.values())
        return n

    def param_resyncs(self) -> dict[str, Any]:
        """Parameter resyncs (docs/chaos.md): restarts whose gateway asked its trainer to fetch the job's
        parameters, how many snapshots were swapped in, and the worst time from restart to swap."""
        needed = done = 0
        worst: float | None = None
        for site, at, stats in self.restarts:
            if stats.requested == 0:
                continue  # came back before the job moved on: nothing missed
            needed += 1
            swapped = [t for t in self.trainers[site].resync_times if t >= at]
            if swapped:
                done += 1
                worst = max(worst or 0.0, swapped[0] - at)
        return {
            "param_resyncs_needed": needed,
            "param_resyncs_done": done,
            "param_resync_worst_s": None if worst is None else round(worst, 3),
            "params_served": sum(t.served for t in self.trainers.values()),
        }

    # -- events ------------------------------------------------------------------------------------

    async def _restart(self, sites: str) -> list[float | None]:
        """Start the killed gateways again, wait until they joined, reconnect their trainers; then the time
        from restart to each site's first delivered round (None if none within 30 s)."""
        starts = {}
        for s in sites:
            starts[s] = self.now()
            await self.cluster.start(s)
            self.restarts.append((s, starts[s], self.cluster.daemons[s].node.resync.stats))
        # the target is 30 s; once a site missed it the job is wedged, and later restarts get 5 s each so
        # that a wedged soak still ends (its keys say so) instead of waiting 30 s per event
        limit = 5.0 if self.resync_missing else 30.0
        for s in sites:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(limit):
                    await self.cluster.daemons[s].wait_joined()
            with contextlib.suppress(WanrtError, OSError, ConnectionError):
                await self.trainers[s].reconnect()
        out: list[float | None] = []
        for s in sites:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(limit):
                    while self.cluster.first_delivery_since_start(s) is None:
                        await self.cluster.wait_changed()
            at = self.cluster.first_delivery_since_start(s)
            out.append(None if at is None else at - starts[s])
        return out

    async def kill(self, sites: str, down: float) -> EventRow:
        for s in sites:
            await self.cluster.kill(s)
        await asyncio.sleep(down)
        return self._resync_row(await self._restart(sites))

    def _resync_row(self, times: list[float | None]) -> EventRow:
        row = EventRow(0, "", "", 0, 0)
        got = [t for t in times if t is not None]
        self.resyncs.extend(got)
        self.resync_missing += len(times) - len(got)
        row.resync_s = max(got) if len(got) == len(times) else None
        return row

    async def trainer_kill(self, site: str, down: float) -> EventRow:
        t = self.trainers[site]
        await t.kill()
        await asyncio.sleep(down)
        with contextlib.suppress(WanrtError, OSError, ConnectionError):
            await t.reconnect()
        self.trainer_restarts += 1
        return EventRow(0, "", "", 0, 0, note=f"{len(t.unacked)} unacked re-sent")

    async def partition(self, pair: str, dur: float) -> EventRow:
        """Cut the pair for ``dur``: every connection between them is reset the moment it exists (the
        shaped link aborted, as a middlebox dropping the flow would), redials included."""
        a, b = pair[0], pair[1]
        resets = 0
        until = self.now() + dur
        while self.now() < until:
            for link in self.cluster.shaped(a, b):
                if not link.closed:
                    link.abort()
                    resets += 1
            await asyncio.sleep(0.05)
        up = len(self.cluster.shaped(a, b))
        return EventRow(0, "", "", 0, 0, note=f"{resets} link ends reset, {up} up right after")

    async def slow_link(self, pair: str, rate: float, dur: float) -> EventRow:
        a, b = pair[0], pair[1]
        links = self.cluster.shaped(a, b)
        for link in links:
            link.set_rate(rate)
        await asyncio.sleep(dur)
        for link in self.cluster.shaped(a, b):  # the same links, or new ones if the old were declared lost
            link.set_rate(self.plan.rate_bps)
        relinked = sum(1 for link in links if link.closed)
        return EventRow(0, "", "", 0, 0, note=f"{len(links)} ends at {rate:g} bit/s, {relinked} relinked")

    async def malicious(self, site: str, down: float) -> EventRow:
        """Kill ``site``'s gateway and play it with the right secret against the survivors."""
        await self.cluster.kill(site)
        # the impersonated site may only dial larger-named sites; pick one it is not the parent of
        survivors = sorted(s for s in SITES if self.cluster.up(s) and s > site)
        d = self.cluster.daemons[survivors[0]]
        frontier = max(0, d.engine.frontier if d.engine is not None else 0)
        it = frontier + 1
        plan = d.engine.plan_for(it) if d.engine is not None else None
        target = next((s for s in survivors if plan is None or plan.parent_of(s) != site), survivors[0])
        d = self.cluster.daemons[target]
        url = self.configs[target].listen
        plan_id = 0 if plan is None else plan.plan_id
        peer = MaliciousPeer(site, JOB, SECRET.encode(), self.rounds)
        accepted: list[str] = []
        if await peer.far_join(url, frontier):
            accepted.append("far join_at")
        n, bs = layer_shape(0)
        forged = finite_payload(0, n, bs)
        # a final from a non-parent is never applied; it is ignored (and counted), not a reason to close
        # the link (plans may differ for a moment after a partition): accepted if the link stayed open and
        # the engine did not count it as ignored — as foreign, or, when the job moved past that round while
        # the handshake ran (a healthy job runs ~10 iterations a second), as stale or conflicting with the
        # result it has. Applied, its values (1000) would also show in the sums (pushes_lost)
        ignored_before = _ignored_finals(d)
        open_after = await peer.forged_round(
            url, kind="final", iteration=it, layer=0, payload=forged, plan_id=plan_id
        )
        if open_after and _ignored_finals(d) == ignored_before:
            accepted.append("final from a non-parent")
        poisoned = nan_payload(0, n, bs)
        if await peer.forged_round(
            url, kind="partial", iteration=it, layer=0, payload=poisoned, plan_id=plan_id
        ):
            accepted.append("NaN partial")
        flood = await peer.hello_flood(url, MAX_PREAUTH_PER_HOST + 4)
        await asyncio.sleep(1.0)
        if d.status()["peers"].get(site, {}).get("state") == "up":
            accepted.append("Hello flood made the site look up")
        for t in flood:
            with contextlib.suppress(Exception):
                await t.close()
        self.forged += len(accepted)
        await asyncio.sleep(max(0.0, down - 1.0))
        row = self._resync_row(await self._restart(site))
        row.forged_accepted = len(accepted)
        row.note = "accepted: " + ", ".join(accepted) if accepted else "4 attacks refused"
        if peer.refusals:
            row.note += f" ({len(peer.refusals)} at the handshake: {peer.refusals[0][:80]})"
        return row

    async def control(self, site: str) -> EventRow:
        """POST /config without a token and with a wrong one (must be 401), then once with the token."""
        import aiohttp

        d = self.cluster.daemons["a"]
        url = d.ready_info()["metrics_url"]
        before = {s: len(t.configs) for s, t in self.trainers.items()}
        body = {"values": {"density": 0.5}}
        accepted = 0
        statuses = []
        for headers in ({}, {"Authorization": "Bearer wrong-token-wrong-token-0000"}):
            async with (
                aiohttp.ClientSession(headers=headers) as http,
                http.post(f"{url}/config", json=body) as r,
            ):
                statuses.append(r.status)
                accepted += r.status < 400
        await asyncio.sleep(1.0)
        changed = sum(len(t.configs) - before[s] for s, t in self.trainers.items())
        self.unauth_accepted += accepted + (changed > 0)
        auth = {"Authorization": f"Bearer {CONTROL_TOKEN}"}
        async with (
            aiohttp.ClientSession(headers=auth) as http,
            http.post(f"{url}/config", json={"values": {"staleness": 1}}) as r,
        ):
            ok = r.status == 200
        self.auth_change_applied += ok
        note = f"unauthenticated: {statuses}, with token: {'200' if ok else 'refused'}"
        return EventRow(0, "", "", 0, 0, note=note)

    # -- the run -----------------------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        self.t0 = self.now()
        for s in sorted(SITES, reverse=True):
            await self.cluster.start(s)
        for s in SITES:
            async with asyncio.timeout(30):
                await self.cluster.daemons[s].wait_joined()
        for t in self.trainers.values():
            await t.connect()
        runs = [asyncio.create_task(t.run(), name=f"trainer {s}") for s, t in self.trainers.items()]
        try:
            return await self._soak(runs)
        finally:
            for r in runs:
                r.cancel()
            await asyncio.gather(*runs, return_exceptions=True)
            await self.cluster.aclose()

    def _log_state(self, end: int) -> None:
        """With ``-v``: where every site stands when the final wait is over (finding a wedge's cause)."""
        if not log.isEnabledFor(logging.INFO):
            return
        for s, d in sorted(self.cluster.daemons.items()):
            t = self.trainers[s]
            eng = d.engine if self.cluster.up(s) else None
            if eng is None:
                log.info("[%s] down or not joined; trainer next_it %d", s, t.next_it)
                continue
            rounds = [eng._rounds[k] for k in eng.open_rounds()[:2]]
            log.info(
                "[%s] t %.1f frontier %d, live %s joins %s held %s, trainer next_it %d (end %d), %d open: %s",
                s,
                self.now() - self.t0,
                eng.frontier,
                ",".join(sorted(eng.live)),
                eng._timeline._joins,
                {p: [(m.kind, m.iteration) for m in q][:3] for p, q in eng._held.queues.items() if q},
                t.next_it,
                end,
                len(eng.open_rounds()),
                "; ".join(
                    f"{r.iteration}/{r.layer} plan {','.join(r.plan.members)} parent {r.plan.parent_of(s)} "
                    f"gathered {r.gathered} taken {r.taken} waits {r.wait_peer} inputs {sorted(r.inputs)}"
                    for r in rounds
                ),
            )

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(2.0)
            self._log_state(-1)

    async def _soak(self, runs: list[asyncio.Task[None]]) -> dict[str, Any]:
        plan = self.plan
        a = self.trainers["a"]
        async with asyncio.timeout(60):
            await a.wait(lambda: a.complete(3))
        gc.collect()
        rss_start = rss_mb()
        records_start = self.harness_record_bytes()
        if self.trace is not None:
            self.trace.mark()
        watch = asyncio.create_task(self._watch()) if log.isEnabledFor(logging.INFO) else None
        events = schedule(plan)
        for n, (kind, sites, dur) in enumerate(events, 1):
            started = self.now()
            if kind in ("kill1", "kill2"):
                row = await self.kill(sites, dur)
            elif kind == "trainer_kill":
                row = await self.trainer_kill(sites, dur)
            elif kind == "partition":
                row = await self.partition(sites, dur)
            elif kind == "bw_drop":
                row = await self.slow_link(sites, plan.drop_bps, dur)
            elif kind == "malicious":
                row = await self.malicious(sites, dur)
            else:
                row = await self.control(sites)
            row.n, row.kind, row.sites = n, kind, sites
            row.started_s, row.took_s = started - self.t0, self.now() - started
            self.rows.append(row)
            print_row(row)
            if self.trace is not None:
                self.trace.point(a.next_it)
                if n == len(events) // 2:
                    self.trace.middle()
            await asyncio.sleep(plan.settle_s)
            for r in runs:
                if r.done() and r.exception() is not None:
                    raise RuntimeError(f"a trainer loop failed: {r.exception()!r}")

        # the end: every trainer runs to the same iteration, and every round up to it must complete
        end = max(t.next_it for t in self.trainers.values()) + 3
        for t in self.trainers.values():
            t.iterations = end
            t.allow_until(None)
        end_started = self.now()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(plan.final_wait_s):
                await asyncio.gather(*runs)
                for t in self.trainers.values():
                    await t.wait(lambda t=t: t.complete(end))  # type: ignore[misc]
        finished_at = self.now()
        if watch is not None:
            watch.cancel()
        self._log_state(end)
        missing = set().union(*(t.missing(end) for t in self.trainers.values()))
        open_rounds = sum(
            len(d.engine.open_rounds())
            for s, d in self.cluster.daemons.items()
            if self.cluster.up(s) and d.engine is not None
        )
        gc.collect()
        rss_end = rss_mb()
        records_growth = (self.harness_record_bytes() - records_start) / 2**20
        memory = None if self.trace is None else self.trace.report()
        if memory is not None:  # after every reading: it changes the process
            memory["rss_end_after_malloc_trim_mb"] = rss_after_trim_mb()
        until = min(finished_at, end_started + plan.final_wait_s)
        silent = {s: max_silent_wait(t, self.t0, until) for s, t in self.trainers.items()}
        for t in self.trainers.values():
            with contextlib.suppress(Exception):
                await t.close()
        await self.cluster.stop_all()
        acc = self.accounting()
        params = [t.parameters() for t in self.trainers.values()]
        missed = differing = 0
        for layer in range(plan.layers):
            fps = [t.fingerprints[layer][:end] for t in self.trainers.values()]
            fps = [np.pad(f, (0, end - len(f)), constant_values=-1) for f in fps]
            stack = np.stack(fps)
            have = (stack >= 0).all(axis=0)
            missed += int((~have & (stack >= 0).any(axis=0)).sum())
            differing += int((have & (stack != stack[0]).any(axis=0)).sum())
        identical = all(
            all(np.array_equal(p[layer], params[0][layer]) for layer in range(plan.layers)) for p in params
        )
        resync = max(self.resyncs) if self.resyncs and not self.resync_missing else None
        param = self.param_resyncs()
        return {
            "pushes_lost": acc["pushes_lost"],
            "pushes_double_counted": acc["pushes_double_counted"],
            "ranks_identical_at_end": int(identical),
            "rounds_missed_by_some_trainer": missed,
            "common_rounds_applied_differently": differing,
            "stuck_rounds": len(missing),
            "rss_growth_mb": round(rss_end - rss_start, 2),
            "max_silent_wait_s": round(max(silent.values()), 3),
            "forged_accepted": self.forged,
            "unauthenticated_changes_accepted": self.unauth_accepted,
            "resync_s": None if resync is None else round(resync, 3),
            # diagnostics
            "seed": plan.seed,
            "events": len(self.rows),
            "end_iteration": end,
            "pushes": acc["pushes"],
            "sum_mismatch_layers": acc["sum_mismatch_layers"],
            "missing_ids": acc["missing_ids"],
            "missing_ids_still_unacked_in_trainer": acc["missing_ids_still_unacked"],
            "recovered_folded": acc["folded"],
            "final_conflicts": acc["final_conflicts"],
            "sites_that_delivered_a_minority_result": "".join(sorted(self.cluster.accounting.minority)),
            "ledger_unresolved": acc["unresolved"],
            "ledger_conflicts": acc["ledger_conflicts"],
            "mass_mismatch": acc["mass_mismatch"],
            "final_conflict_examples": acc["final_conflict_examples"],
            "open_rounds_at_end": open_rounds,
            "resync_median_s": None if not self.resyncs else round(float(np.median(self.resyncs)), 3),
            **param,
            "resync_missing": self.resync_missing,
            "silent_wait_per_site_s": {s: round(v, 3) for s, v in silent.items()},
            "trainer_restarts": self.trainer_restarts,
            "authenticated_change_applied": self.auth_change_applied,
            "trainer_duplicate_aggregates_differing": sum(
                t.mismatched_duplicates for t in self.trainers.values()
            ),
            # the soak's own per-iteration arrays (test trainers' fingerprints and event times, accounting
            # digests and counts): in the RSS growth above, not part of the daemons
            "harness_records_growth_mb": round(records_growth, 2),
            "rss_start_mb": round(rss_start, 1),
            "rss_end_mb": round(rss_end, 1),
            "wall_s": round(self.now() - self.t0, 1),
            "event_rows": [asdict(r) for r in self.rows],
            **({} if memory is None else {"memory_trace": memory}),
        }

    def accounting(self) -> dict[str, Any]:
        """Every push counted exactly once: per contribution id over every delivered result (all sites, all
        generations; the result most sites delivered) plus what a gateway still holds, and the dense sum of
        the results per layer against the dense sum of every push (exact: small integers). A layer whose
        sums differ is explained when the difference is one push's payload (+: counted twice, -: lost)."""
        acc = self.cluster.accounting
        acc.settle()
        counts = {k: bytearray(v) for k, v in acc.counts.items()}
        doubled = missing = mismatch = lost_mass = doubled_mass = unacked_missing = 0
        explained: list[str] = []
        for layer in range(self.plan.layers):
            got = acc.sums[layer].copy()
            for daemon in self.cluster.daemons.values():
                if daemon.engine is not None:
                    for p, ids in daemon.engine.held(layer):
                        if p is not None:
                            p.add_into(got)
                        for s, it in ids:
                            grow_count(counts, s, layer, it)
                if daemon.ledger is not None:
                    for _, p in daemon.ledger.held(layer):
                        p.add_into(got)
            expect = np.zeros_like(got)
            for s, t in self.trainers.items():
                expect += t.pushed_sum[layer]
                c = counts.get((s, layer), bytearray())
                seen = np.frombuffer(bytes(c), np.uint8)
                doubled += int((seen > 1).sum())
                its = t.pushed_iterations(layer)
                counted = np.zeros(len(its), bool)
                inside = its < len(seen)
                counted[inside] = seen[its[inside]] > 0
                missing += int((~counted).sum())
                pending = {it for it, lay in t.unacked if lay == layer}
                unacked_missing += sum(1 for it in its[~counted] if int(it) in pending)
            if not np.array_equal(got, expect):
                mismatch += 1
                diff = got - expect
                who = self._which_push(layer, diff)
                if who is None:
                    explained.append(f"layer {layer}: off by {float(np.abs(diff).sum()):g} (no single push)")
                    lost_mass += 1
                else:
                    sign, site, it = who
                    explained.append(
                        f"layer {layer}: push ({site}, {it}) counted {'twice' if sign > 0 else 'never'}"
                    )
                    if sign > 0:
                        doubled_mass += 1
                    else:
                        lost_mass += 1
        gens = self.cluster.ledger_stats()
        folded = sum(st.recovered_folded for st in gens)
        return {
            "pushes": sum(t.pushes for t in self.trainers.values()),
            "pushes_lost": max(0, missing - folded) + lost_mass,
            "pushes_double_counted": doubled + doubled_mass,
            "sum_mismatch_layers": mismatch,
            "mass_mismatch": explained,
            "missing_ids": missing,
            "missing_ids_still_unacked": unacked_missing,
            "folded": folded,
            "unresolved": sum(st.unresolved for st in gens),
            "ledger_conflicts": sum(st.conflicts for st in gens),
            "final_conflicts": len(acc.conflicts),
            "final_conflict_examples": acc.conflicts[:6],
        }

    def _which_push(self, layer: int, diff: np.ndarray) -> tuple[int, str, int] | None:
        """The one push whose payload is +diff or -diff, if any (the pool repeats: the first one found)."""
        for s in SITES:
            for it in range(7):  # make_payload's pool has 7 payloads per (site, layer)
                dense = make_payload(s, it, layer).to_dense()
                for sign in (1, -1):
                    if np.array_equal(diff, sign * dense):
                        return sign, s, it
        return None


def max_silent_wait(t: ChaosTrainer, t0: float, until: float) -> float:
    """The longest gap between two events the trainer saw (or the end) while it still waited for rounds."""
    times = sorted([t0, *(at for at in t.event_times if at <= until), until])
    return max(b - a for a, b in itertools.pairwise(times))


def print_row(r: EventRow) -> None:
    resync = "" if r.resync_s is None else f"{r.resync_s:.2f}"
    print(
        f"{r.n:>3} {r.kind:<13} {r.sites:<3} {r.started_s:>7.1f} {r.took_s:>6.2f} {resync:>7} "
        f"{r.forged_accepted:>6}  {r.note}",
        flush=True,
    )


TARGETS: dict[str, tuple[str, float]] = {
    "pushes_lost": ("==", 0),
    "pushes_double_counted": ("==", 0),
    "ranks_identical_at_end": ("==", 1),
    "stuck_rounds": ("==", 0),
    "rss_growth_mb": ("<=", 20),
    "max_silent_wait_s": ("<=", 15),
    "forged_accepted": ("==", 0),
    "unauthenticated_changes_accepted": ("==", 0),
    "resync_s": ("<=", 30),
}


def meets(key: str, value: Any) -> bool:
    op, target = TARGETS[key]
    if value is None:
        return False
    return bool(value == target) if op == "==" else bool(value <= target)


log = logging.getLogger("tools.chaos_soak")


def _ignored_finals(d: Any) -> int:
    """Round messages the gateway's engine recognised and dropped (foreign, stale, or conflicting)."""
    if d.engine is None:
        return 0
    st = d.engine.stats
    return int(st.foreign_finals + st.stale_ignored + st.conflicts)


def _name_site(record: logging.LogRecord) -> bool:
    """Every log line names the gateway whose task wrote it (six run in this one process)."""
    record.site = LOG_SITE.get()
    return True


def real_clients_main(args: argparse.Namespace) -> int:
    """``--real-clients``: tools/chaos_real.py's soak; the same table-and-JSON report as the other mode."""
    import tempfile

    from tools.chaos_real import REAL_TARGETS, full_real_plan, quick_real_plan
    from tools.chaos_real import meets as real_meets
    from tools.chaos_real import run as run_real

    plan = quick_real_plan(args.seed) if args.quick else full_real_plan(args.seed)
    if args.rounds is not None:
        plan = dataclasses.replace(plan, rounds_of_events=args.rounds)
    load = os.getloadavg()[0]
    mode = "quick" if args.quick else "full"
    print(f"chaos soak, real clients: 2 sites, seed {plan.seed}, {mode}, load {load:.2f}", flush=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="wanrt-real-soak-") as tmp:
        result = run_real(plan, Path(tmp), quick=bool(args.quick))
    if not args.no_probes:
        _merge_probes(result)
    result["load_start"] = round(load, 2)
    result["load_end"] = round(os.getloadavg()[0], 2)
    result["elapsed_s"] = round(time.perf_counter() - started, 1)
    print()
    print(f"{'key':<34} {'value':>10}  target   ok")
    for key, (op, target) in REAL_TARGETS.items():
        value = result[key]
        print(f"{key:<34} {value!s:>10}  {op} {target:<5} {'yes' if real_meets(key, value) else 'NO'}")
    probes_ok = True
    if not args.no_probes:
        for key, (how, want) in PROBE_TARGETS.items():
            ok = _probe_meets(key, result[key])
            probes_ok = probes_ok and ok
            print(f"{key:<34} {result[key]!s:>10}  {how} {want!s:<5} {'yes' if ok else 'NO'}")
    for key in ("pushes", "result_conflicts", "gateway_restart_back_s", "discarded_steps_worst",
                "foreign_run_refused_s", "events_never_recovered", "elapsed_s", "load_end"):  # fmt: skip
        print(f"{key:<34} {result[key]!s:>10}")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2, sort_keys=True))
    return 0 if probes_ok and all(real_meets(k, result[k]) for k in REAL_TARGETS) else 1


#: tools/chaos_probes.py's keys in the real-client report: key -> (comparison, target)
PROBE_TARGETS: dict[str, tuple[str, object]] = {
    "mistakes_failing_fast": ("==", "all"),
    "forged_join_accepted": ("==", 0),
    "preauth_flood_blocks_rejoin": ("==", 0),
    "closed_link_buffer_mb": ("<=", 64.0),
}


def _probe_meets(key: str, value: object) -> bool:
    op, target = PROBE_TARGETS[key]
    if op == "==":
        return value == target
    return isinstance(value, int | float) and isinstance(target, int | float) and value <= target


def _merge_probes(result: dict[str, Any]) -> None:
    """The users' mistakes and the three attacks (tools/chaos_probes.py, real daemons of their own job) in
    the soak's report. The soak's own mistake, a second run against the job's gateways, joins the mistakes:
    it fails fast when ``wanrt.init`` refused it with one traceback within chaos_probes.FAST_S."""
    from tools.chaos_probes import FAST_S, run_probes

    probes = run_probes()
    said = probes["mistakes_failing_fast"]
    failed = [] if said == "all" else [str(name) for name in cast(list[object], said)]
    if not (result["foreign_run_refused"] == 1 and result["foreign_run_refused_s"] <= FAST_S):
        failed.append("foreign_run")
    probes["mistakes_failing_fast"] = failed or "all"
    probes["probes_elapsed_s"] = probes.pop("elapsed_s")
    result.update(probes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the same soak, fewer events (< 60 s)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--skip", action="append", default=[], choices=EVENT_KINDS, help="leave out a kind")
    ap.add_argument("-v", "--verbose", action="store_true", help="the gateways' log (INFO)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds of events (7 events each; full: 5)")
    ap.add_argument(
        "--trace-memory",
        action="store_true",
        help="tracemalloc + gc counts between the RSS readings, per component (slower; finds, not measures)",
    )
    ap.add_argument(
        "--memory-points",
        action="store_true",
        help="allocator readings after every event and gc counts (no tracemalloc: the run's speed is kept)",
    )
    ap.add_argument(
        "--real-clients",
        action="store_true",
        help="two sites whose trainers use the public client (torch): trainer and gateway kills (issue 21)",
    )
    ap.add_argument(
        "--no-probes",
        action="store_true",
        help="with --real-clients: leave out tools/chaos_probes.py (users' mistakes, three attacks; ~30 s)",
    )
    args = ap.parse_args(argv)
    if args.real_clients:
        return real_clients_main(args)
    os.environ.setdefault("WANRT_KERNELS", "numpy")
    level = logging.INFO if args.verbose else logging.ERROR
    logging.basicConfig(level=level, format="%(levelname)s [%(site)s] %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(_name_site)
    plan = quick_plan(args.seed) if args.quick else full_plan(args.seed)
    plan = dataclasses.replace(plan, skip=tuple(args.skip))
    if args.rounds is not None:
        plan = dataclasses.replace(plan, rounds_of_events=args.rounds)
    trace = MemoryTrace(python_heap=args.trace_memory) if args.trace_memory or args.memory_points else None
    print(
        f"chaos soak: {len(SITES)} sites, seed {plan.seed}, {'quick' if args.quick else 'full'}, "
        f"load {os.getloadavg()[0]:.2f}"
    )
    print("  # event         sites  at_s  took_s resync_s forged  note")
    started = time.perf_counter()

    async def go() -> dict[str, Any]:
        with short_socket_dir("chaos") as tmp:
            return await Soak(plan, tmp, trace=trace).run()

    result = asyncio.run(go())
    result["quick"] = bool(args.quick)
    result["load_end"] = round(os.getloadavg()[0], 2)
    result["elapsed_s"] = round(time.perf_counter() - started, 1)
    print()
    print(f"{'key':<34} {'value':>10}  target   ok")
    for key, (op, target) in TARGETS.items():
        value = result[key]
        print(f"{key:<34} {value!s:>10}  {op} {target:<5} {'yes' if meets(key, value) else 'NO'}")
    for key in (
        "pushes",
        "sum_mismatch_layers",
        "missing_ids",
        "recovered_folded",
        "final_conflicts",
        "open_rounds_at_end",
        "resync_median_s",
        "param_resyncs_needed",
        "param_resyncs_done",
        "param_resync_worst_s",
        "params_served",
        "rounds_missed_by_some_trainer",
        "trainer_restarts",
        "harness_records_growth_mb",
        "end_iteration",
        "elapsed_s",
    ):
        print(f"  {key:<32} {result[key]!s:>10}")
    if "memory_trace" in result:
        print_report(result["memory_trace"])
        print(
            f"  RSS at the end after malloc_trim(0): {result['memory_trace']['rss_end_after_malloc_trim_mb']}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
