"""A deterministic in-memory WAN of :class:`~gateways.rounds.engine.RoundEngine` s on virtual time.

Why a harness and not asyncio: the engine is sans-IO, so the whole multi-gateway protocol can run as a
discrete-event simulation — the simulator's event loop (:class:`sims.des.loop.EventLoop`: a heap ordered
by (time, seq)), per-link latency and bandwidth (FIFO like a TCP stream), and hooks to drop or delay
messages — which is deterministic, fast and lets tests assert exact sums. Unlike :mod:`sims.des`, it
drives bare round engines with round messages (no gateway node, no protocol bytes), so a test can reach
every engine decision directly.

Also models the trainers of each site closely enough to exercise x-order: a site starts iteration n once it
has the results of iteration ``n - 1 - staleness`` for every layer, pushes its layers in backward order over
its compute time, and skips ahead to the newest finished iteration when it fell behind (a straggler).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gateways.rounds.actions import Action, Deliver, PeerSuspect, RoundClosed, Send
from gateways.rounds.config import RoundConfig
from gateways.rounds.engine import RoundEngine
from gateways.rounds.topology import PlanSpec
from sims.des.loop import EventLoop
from tools.harness.exact_payloads import layer_shape, make_payload
from wanrt.errors import RemoteProtocolError
from wanrt.payload import SparsePayload
from wanrt.protocol.peer.round_msg import ContribId, RoundMsg

Key = tuple[int, int]


@dataclass(frozen=True)
class Link:
    latency: float = 0.01  # one-way, seconds
    bandwidth: float = 1e7  # bytes per second


def msg_bytes(m: RoundMsg) -> int:
    """A rough wire size: header, ids, COO indices and fp32 values."""
    size = 64 + 12 * len(m.sites)
    if m.payload is not None:
        size += 8 * m.payload.nnz_blocks + 4 * m.payload.nnz
    return size


class Net:
    """N engines joined by shaped links; ``run()`` advances virtual time until nothing is left to do."""

    def __init__(
        self,
        sites: Iterable[str],
        spec: PlanSpec,
        config: RoundConfig | None = None,
        *,
        links: dict[tuple[str, str], Link] | None = None,
        default_link: Link = Link(),
    ) -> None:
        self.sites = tuple(sorted(sites))
        self.config = config or RoundConfig()
        self.engines = {s: RoundEngine(s, self.sites, spec, self.config) for s in self.sites}
        self.links = links or {}
        self.default_link = default_link
        self.loop = EventLoop()
        self._link_free: dict[tuple[str, str], float] = {}
        self._last_arrival: dict[tuple[str, str], float] = {}
        self._tick_at: dict[str, float] = {}
        self.cut: set[str] = set()  # partitioned sites: every message to or from them is dropped
        self.drop: Callable[[str, str, RoundMsg, float], bool] | None = None
        self.delay: Callable[[str, str, RoundMsg, float], float] | None = None
        self.delivered: dict[str, dict[Key, Deliver]] = {s: {} for s in self.sites}
        self.delivered_at: dict[str, dict[Key, float]] = {s: {} for s in self.sites}
        self.closed: dict[str, list[RoundClosed]] = {s: [] for s in self.sites}
        self.suspects: list[tuple[str, PeerSuspect]] = []
        self.errors: list[tuple[str, str, RemoteProtocolError]] = []
        self.pushes: list[tuple[str, int, int, SparsePayload]] = []
        self.messages = 0
        self.bytes = 0
        self.listeners: list[Callable[[str, Action], None]] = []

    # --- scheduling -----------------------------------------------------------------------------------
    @property
    def now(self) -> float:
        return self.loop.now

    def at(self, t: float, fn: Callable[[], None]) -> None:
        self.loop.at(t, fn)

    def run(self, until: float | None = None, max_events: int = 10_000_000) -> None:
        start = self.loop.events_run

        def budget() -> bool:
            if self.loop.events_run - start >= max_events:
                raise RuntimeError("event budget exhausted: the protocol does not quiesce")
            return False

        self.loop.run(until=math.inf if until is None else until, stop=budget)
        if until is not None and self.loop.now < until:
            self.loop.now = until

    # --- inputs ---------------------------------------------------------------------------------------
    def push(self, site: str, iteration: int, layer: int, payload: SparsePayload) -> None:
        """The trainers of ``site`` push now."""
        self.pushes.append((site, iteration, layer, payload))
        self._apply(site, self.engines[site].local_push(iteration, layer, payload, self.now))

    def lose(self, site: str, peer: str) -> None:
        self._apply(site, self.engines[site].peer_lost(peer, self.now))

    def join(self, site: str, peer: str, iteration: int) -> None:
        self._apply(site, self.engines[site].peer_joined(peer, self.now, iteration))

    def set_spec(self, spec: PlanSpec, effective: int | None = None) -> None:
        for s in self.sites:
            self._apply(s, self.engines[s].set_plan(spec, self.now, effective))

    # --- plumbing -------------------------------------------------------------------------------------
    def _apply(self, site: str, actions: list[Action]) -> None:
        for a in actions:
            if isinstance(a, Send):
                self._transmit(site, a.peer, a.msg)
            elif isinstance(a, Deliver):
                key = (a.iteration, a.layer)
                assert key not in self.delivered[site], f"{site} delivered {key} twice"
                self.delivered[site][key] = a
                self.delivered_at[site][key] = self.now
            elif isinstance(a, RoundClosed):
                self.closed[site].append(a)
            elif isinstance(a, PeerSuspect):
                self.suspects.append((site, a))
            for fn in self.listeners:
                fn(site, a)
        self._schedule_tick(site)

    def _schedule_tick(self, site: str) -> None:
        due = self.engines[site].next_deadline()
        if due is None:
            return
        planned = self._tick_at.get(site)
        if planned is not None and planned <= due and planned >= self.now:
            return
        self._tick_at[site] = due

        def fire() -> None:
            if self._tick_at.get(site) == due:
                del self._tick_at[site]
            self._apply(site, self.engines[site].tick(self.now))

        self.at(due, fire)

    def _transmit(self, src: str, dst: str, m: RoundMsg) -> None:
        if src in self.cut or dst in self.cut:
            return
        if self.drop is not None and self.drop(src, dst, m, self.now):
            return
        link = self.links.get((src, dst), self.default_link)
        size = msg_bytes(m)
        self.messages += 1
        self.bytes += size
        depart = max(self.now, self._link_free.get((src, dst), 0.0))
        self._link_free[(src, dst)] = depart + size / link.bandwidth
        arrive = depart + size / link.bandwidth + link.latency
        if self.delay is not None:
            arrive += self.delay(src, dst, m, self.now)
        arrive = max(arrive, self._last_arrival.get((src, dst), 0.0))  # a stream never reorders
        self._last_arrival[(src, dst)] = arrive

        def deliver() -> None:
            if src in self.cut or dst in self.cut:
                return  # the link went down while the message was in flight
            try:
                actions = self.engines[dst].peer_message(src, m, self.now)
            except RemoteProtocolError as exc:
                self.errors.append((dst, src, exc))
                return
            self._apply(dst, actions)

        self.at(arrive, deliver)


# --------------------------------------------------------------------------------------------------------
# payloads and trainers
# --------------------------------------------------------------------------------------------------------
class Trainers:
    """Per-site trainer loops (see the module docstring) driving ``net`` for ``iterations`` iterations."""

    def __init__(
        self,
        net: Net,
        *,
        iterations: int,
        layers: int,
        compute: dict[str, float] | float = 0.05,
        staleness: int = 1,
        payload: Callable[[str, int, int], SparsePayload] = make_payload,
    ) -> None:
        self.net = net
        self.iterations = iterations
        self.layers = layers
        self.compute = compute if isinstance(compute, dict) else dict.fromkeys(net.sites, compute)
        self.staleness = staleness
        self.payload = payload
        self.next_it = dict.fromkeys(net.sites, 0)
        self.busy = dict.fromkeys(net.sites, False)
        self.paused: set[str] = set()
        self.resolved: dict[str, dict[int, set[int]]] = {s: {} for s in net.sites}
        self.newest: dict[str, int] = dict.fromkeys(net.sites, -1)
        net.listeners.append(self._on_action)

    def start(self) -> None:
        for s in self.net.sites:
            self._maybe_start(s)

    def resume(self, site: str, at_iteration: int) -> None:
        self.paused.discard(site)
        self.next_it[site] = max(self.next_it[site], at_iteration)
        self._maybe_start(site)

    def _on_action(self, site: str, a: Any) -> None:
        if isinstance(a, (Deliver, RoundClosed)):
            done = self.resolved[site].setdefault(a.iteration, set())
            done.add(a.layer)
            if len(done) == self.layers:
                self.newest[site] = max(self.newest[site], a.iteration)
                self.net.at(self.net.now, lambda: self._maybe_start(site))

    def _ready(self, site: str, n: int) -> bool:
        need = n - 1 - self.staleness
        return need < 0 or len(self.resolved[site].get(need, ())) == self.layers or need <= self.newest[site]

    def _maybe_start(self, site: str) -> None:
        if self.busy[site] or site in self.paused:
            return
        n = max(self.next_it[site], self.newest[site] + 1)  # a straggler skips what is already finished
        if n >= self.iterations or not self._ready(site, n):
            return
        self.busy[site] = True
        self.next_it[site] = n
        c = self.compute[site]
        for k, layer in enumerate(reversed(range(self.layers))):  # backward pass: last layer first
            t = self.net.now + c * (k + 1) / self.layers

            def fire(layer: int = layer, last: bool = k == self.layers - 1) -> None:
                if site not in self.paused:
                    self.net.push(site, n, layer, self.payload(site, n, layer))
                if last:
                    self.busy[site] = False
                    self.next_it[site] = n + 1
                    self._maybe_start(site)

            self.net.at(t, fire)


# --------------------------------------------------------------------------------------------------------
# checks shared by the tests
# --------------------------------------------------------------------------------------------------------
def distinct_finals(net: Net, authority: Iterable[str] | None = None) -> dict[Key, Deliver]:
    """One result per round, asserting every ``authority`` site that has it got a bit-identical copy."""
    finals: dict[Key, Deliver] = {}
    for s in authority or net.sites:
        for key, d in net.delivered[s].items():
            ref = finals.get(key)
            if ref is None:
                finals[key] = d
            else:
                assert _same(d, ref), f"{s} got a different result for {key}"
    return finals


def _same(a: Deliver, b: Deliver) -> bool:
    if a.sites != b.sites:
        return False
    if a.payload is None or b.payload is None:
        return a.payload is b.payload
    return np.array_equal(a.payload.indices, b.payload.indices) and np.array_equal(
        a.payload.values, b.payload.values
    )


def divergent(net: Net, authority: Iterable[str]) -> set[tuple[str, Key]]:
    """Results delivered outside ``authority`` that the authority never had or had differently (a site
    cut off right after finishing a round keeps its private result)."""
    auth = tuple(authority)
    finals = distinct_finals(net, auth)
    out = set()
    for s in net.sites:
        if s in auth:
            continue
        for key, d in net.delivered[s].items():
            ref = finals.get(key)
            if ref is None or not _same(d, ref):
                out.add((s, key))
    return out


def assert_accounted(
    net: Net, authority: Iterable[str] | None = None, lost: Iterable[str] = ()
) -> dict[Key, Deliver]:
    """The record of ``authority`` (default: every site) is exact: its results agree, every push is in
    exactly one result or still held by its site, and Σ results + Σ held == Σ those pushes, bit for bit.
    Pushes of ``lost`` sites (gone for good) may be missing: they died with their site."""
    finals = distinct_finals(net, authority)
    lost = set(lost)
    layers = sorted({layer for _, _, layer, _ in net.pushes})
    for layer in layers:
        seen: dict[ContribId, str] = {}
        dense_len = layer_shape(layer)[0]
        got = np.zeros(dense_len, np.float32)
        for key, d in finals.items():
            if key[1] != layer:
                continue
            if d.payload is not None:
                d.payload.add_into(got)
            for cid in d.sites:
                assert cid not in seen, f"layer {layer}: {cid} counted twice ({seen[cid]} and final {key})"
                seen[cid] = f"final {key}"
        for s in net.sites:
            for p, ids in net.engines[s].held(layer):
                if p is not None:
                    p.add_into(got)
                for cid in ids:
                    assert cid not in seen, f"layer {layer}: {cid} both held by {s} and {seen[cid]}"
                    seen[cid] = f"held by {s}"
        pushed = {(s, it): p for s, it, lay, p in net.pushes if lay == layer}
        assert set(seen) <= set(pushed), f"layer {layer}: ids never pushed: {sorted(set(seen) - set(pushed))}"
        missing = {cid for cid in pushed if cid not in seen}
        assert all(s in lost for s, _ in missing), f"layer {layer}: never accounted: {sorted(missing)[:5]}"
        expect = np.zeros(dense_len, np.float32)
        for cid, p in pushed.items():
            if cid in seen:
                p.add_into(expect)
        np.testing.assert_array_equal(got, expect, err_msg=f"layer {layer} sums differ")
    return finals
