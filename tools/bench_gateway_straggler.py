"""Part (c) of ``tools/bench_gateway.py``: seed 002's rate reallocation through real gateway daemons.

The emulation, and what "3× slower" and "boost" mean in it
-----------------------------------------------------------
Four sites ``a b c d`` run real :class:`~gateways.service.daemon.GatewayDaemon` s in a **star rooted at
a**: each
child sends its contribution up, the root sends the aggregate down. The root is the one gateway with several
links that carry data (a child has only its link to the root), so it is where a straggling link can be
detected and helped; its :class:`~gateways.sending.rate_allocator.RateAllocator` sees the three root links'
times, measured by
the daemon itself (:mod:`gateways.sending.link_times`: first byte of an iteration's messages out → the
peer's ack).

Each root link ``a↔x`` is emulated by two :class:`~transports.ShapedTransport` s (one per direction, the
daemons' own ``[gateway.shaping]``). Seed 002's network model is ``delay_i = d_base / r_i``: the rate
``r_i`` the scheduler grants link i *is* its speed. The emulation applies exactly that, at the start of
every iteration, to both directions of each root link::

    capacity_x = base_bps × (r_x / r_base) / slowdown_x(iteration)

* ``slowdown_x`` is the profile: ``straggler`` = 3 for link a↔d, always (the link delivers a third of
  the base rate: 33 Mbit/s instead of 100); ``bursty`` = 5 with probability 0.2 per iteration and link,
  drawn once per run from a seeded generator, so both arms see identical draws (paired comparison).
* ``r_x / r_base`` is the root allocator's current rate for x over its base rate (the allocator the daemon
  runs; the daemon also applies ``r_x`` to its own per-link pacer, the token bucket in front of the shaper,
  as it does in production). A **boost** of α = 0.3 therefore makes link d carry 1.3× what it did; a
  **penalty** makes the donors carry (1 − β·|S|/(N − |S|)) of theirs. With the paper's
  ``conserve_total = false`` (the default) the boost is capacity from nowhere; ``conserve_total = true``
  rows rescale the rates to the base sum, as a shared uplink would.

Physically this is the seed's assumption transplanted, not a property of real WANs: raising a sender's rate
helps a link only if the sender's pacing (its share of a shared uplink or of an overlay path) was what
limited it. A link slowed by a bottleneck the gateway does not control (a congested transit router) gains
nothing from a higher pacer rate; the emulation does not model that case, and says so in its output.

Timing: the four trainers run in lockstep (seed 002's synchronous all-reduce: ``T_iter = compute +
max_i T_flow_i``): push 4 layers, wait until every site holds every aggregate, sleep ``compute``. The
compute time is set from the measured uniform communication time so that communication is 70 % of a
uniform iteration (the seed's workload). Both arms (rates enabled / disabled) run at the same time as two
clusters and take turns in blocks of iterations, so background load on the machine hits both alike.

Differences from the fluid model (:mod:`sims.models.fluid_round`), reported beside it: the fluid model's
headline runs 250 iterations, the emulation 250 too (16 with ``--quick``), and the boosts ramp up over the
first ~13 (three boosts, 5 iterations of cooldown apart, then the allocator holds them), so the emulation is
also compared with the model at its own run length; the measured times include protocol, aggregation and
event-loop overheads that do not scale with the link rate. The node measures a link's time as the union of
its messages' send-to-ack spans and reports an iteration as soon as it is acknowledged
(:class:`~gateways.sending.link_times.LinkTimes`).
"""

from __future__ import annotations

import asyncio
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from bench_gateway_cluster import (
    BLOCK,
    Cluster,
    now,
    payload_bytes,
    payload_of,
    running,
    short_dir,
    star_configs,
)

from gateways.config import PeerShape, RateConfig
from sims.models.fluid_round import compare
from wanrt.payload import SparsePayload

SITES = "abcd"
ROOT = "a"
LINKS = ("b", "c", "d")
STRAGGLER = "d"


@dataclass(frozen=True)
class StragglerSetup:
    iterations: int = 250  # measured iterations per arm and profile, seed 002's run length (held from ~13 on)
    warmup: int = 6  # uniform iterations first: kernels, links, and the compute-time calibration
    block: int = 1  # iterations an arm runs before the other takes its turn (1: paired iterations)
    layers: int = 4
    layer_len: int = 250_000
    density: float = 0.008  # per site; the aggregate (union of 4 sites' blocks) is ~3.9x as dense
    base_bps: float = 10e6  # slow enough that the links, not the 4 daemons' shared CPU, dominate
    burst_bytes: int = 16 << 10  # one shaper chunk: a full bucket must not carry a whole layer for free
    comm_fraction: float = 0.7  # seed 002: communication is 70 % of a (uniform) iteration
    seed: int = 0
    fluid_seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    fluid_iterations: int = 250
    conserve_rows: bool = False  # also run conserve_total = true (one more pair of clusters per profile)


def slowdowns(profile: str, iterations: int, seed: int) -> list[dict[str, float]]:
    """Per iteration and root link, how many times slower than base the link is (seed 002's profiles)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(iterations):
        if profile == "straggler":
            out.append({x: 3.0 if x == STRAGGLER else 1.0 for x in LINKS})
        elif profile == "bursty":
            out.append({x: 5.0 if rng.random() < 0.2 else 1.0 for x in LINKS})
        else:
            raise ValueError(profile)
    return out


@dataclass
class Arm:
    """One cluster (rate reallocation on or off) and the iterations it ran."""

    name: str
    cluster: Cluster
    setup: StragglerSetup
    next_it: int = 0
    times: list[float] = field(default_factory=list)
    comm: list[float] = field(default_factory=list)
    caps: list[dict[str, float]] = field(default_factory=list)
    trace: list[dict[str, Any]] = field(default_factory=list)

    def _apply(self, slow: dict[str, float]) -> dict[str, float]:
        root = self.cluster.daemons[ROOT]
        rates = root.allocator.rates()
        base = root.cfg.base_rates_bps()
        caps = {}
        for x in LINKS:
            cap = self.setup.base_bps * (rates[x] / base[x]) / slow[x]
            root.shapers[x].set_rate(cap)
            self.cluster.daemons[x].shapers[ROOT].set_rate(cap)
            caps[x] = cap
        return caps

    async def iteration(self, slow: dict[str, float], compute_s: float, *, record: bool = True) -> float:
        caps = self._apply(slow)
        it = self.next_it
        self.next_it += 1
        s = self.setup
        t0 = now()

        async def push(site: str) -> None:
            for layer in reversed(range(s.layers)):
                await self.cluster.trainers[site].push(it, layer, site_payload(s, site, layer))

        await asyncio.gather(*(push(site) for site in SITES))
        keys = [(it, layer) for layer in range(s.layers)]
        try:
            await asyncio.gather(*(t.wait_for(keys, timeout=60) for t in self.cluster.trainers.values()))
        except TimeoutError:
            raise RuntimeError(f"{self.name}: iteration {it} stuck\n{self.cluster.diagnose()}") from None
        comm = now() - t0
        if compute_s > 0:
            await asyncio.sleep(compute_s)  # the trainers' forward/backward pass
        if record:
            self.times.append(now() - t0)
            self.comm.append(comm)
            self.caps.append(caps)
            self.trace.append(self._trace_row())
        return comm

    def _trace_row(self) -> dict[str, Any]:
        """What the root allocator last saw and decided: the instrument for judging its dynamics."""
        snap = self.cluster.daemons[ROOT].allocator.snapshot()
        return {
            "observed": snap.iteration,
            "action": snap.last_action,
            "boost": {x: snap.links[x].rate_bps / snap.links[x].base_bps for x in LINKS},
            "link_s": {x: snap.links[x].last_time_s for x in LINKS},
        }

    def summary(self) -> dict[str, Any]:
        root = self.cluster.daemons[ROOT]
        return {
            "mean_iteration_s": statistics.fmean(self.times),
            "median_iteration_s": statistics.median(self.times),
            "mean_comm_s": statistics.fmean(self.comm),
            "reallocations": root.allocator.reallocations,
            "final_rates_bps": root.allocator.rates(),
            "iteration_s": self.times,
            "capacity_bps": self.caps,
            "trace": self.trace,
        }


def site_payload(setup: StragglerSetup, site: str, layer: int) -> SparsePayload:
    """Each site selects its own blocks (as top-k of its own gradient would), the same every iteration."""
    return payload_of(layer, setup.layer_len, setup.density, seed=SITES.index(site))


def _configs(d: Any, setup: StragglerSetup, rates: RateConfig) -> Any:
    shape = PeerShape(rate_bps=setup.base_bps, burst=setup.burst_bytes)
    shaping = {(ROOT, x): shape for x in LINKS} | {(x, ROOT): shape for x in LINKS}
    return star_configs(d, SITES, shaping=shaping, rates=rates, link_rate_bps=setup.base_bps)


async def run_profile(profile: str, setup: StragglerSetup, ours_cfg: RateConfig) -> dict[str, Any]:
    """Baseline (allocator disabled) vs ``ours_cfg`` on identical slowdown draws, taking turns in blocks."""
    draws = slowdowns(profile, setup.iterations, setup.seed)
    with short_dir() as d:
        (d / "base").mkdir()
        (d / "ours").mkdir()
        base_cfg = _configs(d / "base", setup, RateConfig(enabled=False))
        our_cfg = _configs(d / "ours", setup, ours_cfg)
        async with running(base_cfg) as cb, running(our_cfg) as co:
            arms = [Arm("baseline", cb, setup), Arm("ours", co, setup)]
            uniform = dict.fromkeys(LINKS, 1.0)
            calib: list[float] = []
            for i in range(setup.warmup):
                for arm in arms:
                    comm = await arm.iteration(uniform, 0.0, record=False)
                    if i >= setup.warmup // 2:
                        calib.append(comm)
            comm_s = statistics.median(calib)
            compute_s = comm_s * (1 - setup.comm_fraction) / setup.comm_fraction
            for turn, start in enumerate(range(0, setup.iterations, setup.block)):
                # ABBA order: whichever arm goes second gets the tail of the other's work (acks, wake-ups)
                for arm in arms if turn % 2 == 0 else arms[::-1]:
                    for j in range(start, min(start + setup.block, setup.iterations)):
                        await arm.iteration(draws[j], compute_s)
            base, ours = arms[0].summary(), arms[1].summary()
    change = ours["mean_iteration_s"] / base["mean_iteration_s"] - 1
    # both arms ran iteration j with the same draws: the spread of the paired differences says how much of
    # ``change`` the machine's background load alone could produce
    diffs = [o - b for o, b in zip(arms[1].times, arms[0].times, strict=True)]
    se = (
        statistics.stdev(diffs) / len(diffs) ** 0.5 / base["mean_iteration_s"] if len(diffs) > 1 else math.nan
    )
    return {
        "profile": profile,
        "rates": {"alpha": ours_cfg.alpha, "beta": ours_cfg.beta, "conserve_total": ours_cfg.conserve_total},
        "uniform_comm_s": comm_s,
        "compute_s": compute_s,
        "baseline": base,
        "ours": ours,
        "change": change,
        "change_se": se,
    }


def fluid_lagged(
    profile: str, *, lag: int, n_links: int, iterations: int, seeds: tuple[int, ...], cfg: RateConfig
) -> float:
    """:func:`sims.models.fluid_round.simulate`'s model, but the allocator sees iteration i only at
    iteration i + lag.

    With ``lag`` 0 this is the plain model run for as many iterations as the emulation (the ramp of
    boosts, 5 iterations of cooldown apart, included); a larger lag shows what a late observation costs
    the policy (the daemon used to report ``rounds.window + 1`` iterations late). Same draws for both
    arms (the slowdowns do not depend on the rates). Returns ours/base - 1.
    """
    from collections import deque

    from gateways.sending.rate_allocator import RateAllocator
    from sims.models.fluid_round import PROFILES

    def run(seed: int, alloc: RateAllocator | None) -> float:
        rng = np.random.default_rng(seed)
        links = [f"l{i}" for i in range(n_links)]
        rates = dict.fromkeys(links, 1.0)
        pending: deque[tuple[int, dict[str, float]]] = deque()
        total = 0.0
        for it in range(iterations):
            slow = PROFILES[profile](rng, n_links)
            link_t = {p: 0.7 * float(slow[i]) / rates[p] for i, p in enumerate(links)}
            total += 0.3 + max(link_t.values())
            if alloc is not None:
                pending.append((it, link_t))
                while pending and pending[0][0] <= it - lag:
                    seen, times = pending.popleft()
                    rates = alloc.observe(seen, times)
        return total / iterations

    links = [f"l{i}" for i in range(n_links)]
    base = statistics.fmean(run(s, None) for s in seeds)
    ours = statistics.fmean(run(s, RateAllocator(links, dict.fromkeys(links, 1.0), cfg)) for s in seeds)
    return ours / base - 1


def _fluid(setup: StragglerSetup, n_links: int, conserve: bool) -> dict[str, float]:
    rows = compare(
        ("straggler", "bursty"),
        seeds=setup.fluid_seeds,
        iterations=setup.fluid_iterations,
        n_links=n_links,
        cfg=RateConfig(conserve_total=conserve),
    )
    return {r.profile: r.change for r in rows}


def _union_bytes(setup: StragglerSetup) -> int:
    total = 0
    for layer in range(setup.layers):
        idx = np.unique(np.concatenate([site_payload(setup, s, layer).indices for s in SITES]))
        total += len(idx) * (8 + 4 * BLOCK)
    return total


async def run_straggler(setup: StragglerSetup) -> dict[str, Any]:
    up = [site_payload(setup, s, layer) for s in SITES for layer in range(setup.layers)]
    out: dict[str, Any] = {
        "sites": SITES,
        "topology": f"star rooted at {ROOT}",
        "straggler_link": f"{ROOT}<->{STRAGGLER}",
        "up_bytes_per_site": sum(payload_bytes(p) for p in up) // len(SITES),
        "down_bytes_per_site": _union_bytes(setup),
        "base_bps": setup.base_bps,
        "emulated": {},
        "model": {},
    }
    variants = [("paper", RateConfig())]
    if setup.conserve_rows:
        variants.append(("conserve", RateConfig(conserve_total=True)))
    for label, cfg in variants:
        for profile in ("straggler", "bursty"):
            out["emulated"][f"{profile}/{label}"] = await run_profile(profile, setup, cfg)
        conserve = cfg.conserve_total
        out["model"][label] = {f"{n}_links": _fluid(setup, n, conserve) for n in (len(LINKS), 4)}
        # the node reports an iteration's link times once its messages are acknowledged, so the new rates
        # apply from the next iteration: the model's lag 0 (the model at the emulation's run length, ramp
        # included, is what the measurement should be compared with)
        lag = 0
        out["model"][label]["3_links_same_length"] = {
            p: fluid_lagged(
                p,
                lag=lag,
                n_links=len(LINKS),
                iterations=setup.iterations,  # as long as the emulated run, transient included
                seeds=setup.fluid_seeds,
                cfg=cfg,
            )
            for p in ("straggler", "bursty")
        }
        out["model"][label]["lag_iterations"] = lag
    out["straggler_iter_reduction"] = -out["emulated"]["straggler/paper"]["change"]
    out["bursty_overhead"] = out["emulated"]["bursty/paper"]["change"]
    out["model_straggler_iter_reduction"] = -out["model"]["paper"][f"{len(LINKS)}_links"]["straggler"]
    out["model_bursty_overhead"] = out["model"]["paper"][f"{len(LINKS)}_links"]["bursty"]
    return out


def print_straggler(s: dict[str, Any]) -> None:
    print(
        f"\n(c) seed 002 rate reallocation: 4 sites, {s['topology']}, per iteration and root link "
        f"{s['up_bytes_per_site'] / 1e3:.0f} kB up / {s['down_bytes_per_site'] / 1e3:.0f} kB down, "
        f"base {s['base_bps'] / 1e6:g} Mbit/s; slow link = {s['straggler_link']}"
    )
    print(
        f"  {'profile/rates':20} {'compute s':>9} {'base it s':>9} {'ours it s':>9} {'change':>8} "
        f"{'± 2 SE':>7} {'reallocs':>8} {'model 3 links':>13} {'4 links':>8} {'same length':>11}"
    )
    for key, r in s["emulated"].items():
        profile, label = key.split("/")
        model = s["model"][label]
        print(
            f"  {key:20} {r['compute_s']:9.3f} {r['baseline']['mean_iteration_s']:9.3f} "
            f"{r['ours']['mean_iteration_s']:9.3f} {r['change']:+8.1%} {2 * r['change_se']:7.1%} "
            f"{r['ours']['reallocations']:8d} "
            f"{model['3_links'][profile]:+13.1%} {model['4_links'][profile]:+8.1%} "
            f"{model['3_links_same_length'][profile]:+11.1%}"
        )
    print(
        "  (emulated: real daemons, link capacity = base x allocator share / slowdown, applied to both\n"
        "   directions each iteration; model: sims.models.fluid_round, same allocator on virtual time,\n"
        "   no overheads;\n"
        "   same length: the model run as many iterations as the emulation, ramp of boosts included)"
    )
    print(
        f"  straggler_iter_reduction = {s['straggler_iter_reduction']:.3f}   "
        f"bursty_overhead = {s['bursty_overhead']:+.4f}"
    )
