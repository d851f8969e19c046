"""The simulation: whole :class:`~gateways.node.GatewayNode` s on virtual time, over modelled links.

This is the daemon's service layer (``gateways/service``) replaced by an event heap. Per gateway the
driver does what :class:`~gateways.service.daemon.GatewayDaemon` does: hand the node received bytes and
trainer messages with the (virtual) time, carry out :meth:`GatewayNode.pop_actions`, and call
:meth:`GatewayNode.tick` at :meth:`GatewayNode.next_deadline`. Per link direction it does what a
:class:`~gateways.service.peer_link.PeerLink` writer does: :meth:`GatewayNode.poll_link`, write the parts
into the link model while its send buffer has room, sleep until the pacer's time or a ``Wake``. Links are
authenticated with the real protocol handshake (seeded nonces) and carry the real protocol bytes, so a
simulated gateway makes exactly the decisions a real one makes.

Simplifications, stated: links come up at t = 0 (the handshake's round trips are not timed); the trainer
↔ gateway hop inside a site is instantaneous and in memory (``trainer_push`` / ``ToTrainer``); CPU time
of the gateways is zero (a 2-core machine's scheduling noise is exactly what the simulator removes).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
from collections.abc import Callable, Iterator
from typing import Final

import numpy as np

from gateways.config import GatewayConfig
from gateways.node import CloseLink, GatewayNode, RefuseTrainer, ToTrainer, Wake
from gateways.rounds.actions import Action, RoundClosed
from gateways.rounds.topology import Plan, PlanSpec, build_plan
from sims.des.compute import ComputeModel
from sims.des.link import LinkModel
from sims.des.loop import EventLoop, SimulationStuck
from sims.des.payloads import make_payload, payload_digest
from sims.des.results import LinkResult, SimResult
from sims.des.scenario import LinkSpec, Scenario
from sims.des.trainer import TrainerState
from transports.traces import BandwidthTrace, profile_traces
from wanrt.codec.kernel_choice import KERNEL_ENV
from wanrt.errors import WanrtError
from wanrt.payload import SparsePayload
from wanrt.protocol import Ack, Aggregate, Auth, Connection, Hello, Push, Role, Welcome
from wanrt.protocol.peer.round_frames import GATEWAY_REGISTRY

__all__ = ["JOB", "SECRET", "SimResult", "Simulation", "frozen_world", "run_scenario"]

JOB = "sim"
SECRET = "sim-secret-0123456789abcdef"
#: The trainer session id every simulated gateway knows its trainer by.
SESSION = 1


class _Dir:
    """One direction of a connected link, seen from its sender: the writer's state."""

    __slots__ = ("blocked", "done", "dst", "dst_link", "link_id", "model", "site", "timer_at")

    def __init__(self, site: str, link_id: int, model: LinkModel, dst: str, dst_link: int) -> None:
        self.site = site
        self.link_id = link_id
        self.model = model
        self.dst = dst
        self.dst_link = dst_link
        self.timer_at: float | None = None  # a pacing wake-up is scheduled at this time
        self.blocked = False  # the send buffer is full; the link wakes the writer when it has room
        self.done = False


class Simulation:
    """One run of a :class:`~sims.des.scenario.Scenario` (see the module docstring).

    ``clock`` (e.g. ``time.perf_counter``) is only used to report wall time: the simulator itself never
    reads a clock.
    """

    def __init__(
        self, sc: Scenario, *, clock: Callable[[], float] | None = None, keep_payloads: bool = False
    ) -> None:
        self.sc = sc
        #: (site, iteration, layer) -> the aggregate itself, when ``keep_payloads`` (tests compare sums)
        self.payloads: dict[tuple[str, int, int], SparsePayload] | None = {} if keep_payloads else None
        self.clock = clock
        self.names = sc.site_names()
        self.index = {s: i for i, s in enumerate(self.names)}
        self.sizes = sc.payload.layer_sizes()
        self.loop = EventLoop()
        self.compute = ComputeModel(sc.compute, self.names, sc.seed)
        root = sc.gateway.root or self.names[0]
        rc = sc.gateway.rounds
        self.plan: Plan = build_plan(PlanSpec.make(rc.topology, arity=rc.tree_arity, root=root), self.names)
        self.nodes: dict[str, GatewayNode] = {}
        self.trainers: dict[str, TrainerState] = {}
        self._dirs: dict[tuple[str, int], _Dir] = {}
        self._timer_at: dict[str, float] = {}
        self._unfinished = 0
        self.first_push: dict[tuple[int, int], float] = {}
        self.last_delivery: dict[tuple[int, int], float] = {}
        self.aggregates: dict[tuple[str, int, int], tuple[float, str, int]] = {}
        self.round_closed: list[tuple[str, int, int, float, int, bool]] = []
        self.frontier: dict[str, tuple[list[float], list[int]]] = {s: ([], []) for s in self.names}
        self.problems: list[str] = []
        self._rng = np.random.default_rng([sc.seed, 3])
        self._links: dict[tuple[str, str], LinkModel] = {}

    # ------------------------------------------------------------------------------------------------
    # building the world
    # ------------------------------------------------------------------------------------------------

    def link_pairs(self) -> list[tuple[str, str]]:
        """Every (a, b), a < b, that gets a link: all pairs, or the plan's neighbours only."""
        if self.sc.gateway.links == "all":
            return [(a, b) for i, a in enumerate(self.names) for b in self.names[i + 1 :]]
        pairs = {(min(s, n), max(s, n)) for s in self.names for n in self.plan.neighbours(s)}
        return sorted(pairs)

    def _configs(self) -> dict[str, GatewayConfig]:
        gw = self.sc.gateway
        urls = {s: f"unix:///sim/{s}" for s in self.names}
        first: GatewayConfig | None = None
        out = {}
        for s in self.names:
            peers = {p: urls[p] for p in self.names if p != s}
            if first is None:
                first = GatewayConfig(
                    site=s,
                    job=JOB,
                    secret=SECRET,
                    listen=urls[s],
                    trainer_listen=f"unix:///sim/t{s}",
                    peers=peers,
                    root=gw.root or self.names[0],
                    link_rate_bps=gw.link_rate_bps,
                    rounds=gw.rounds,
                    edf=gw.edf,
                    rates=gw.rates,
                    timeouts=gw.timeouts,
                    links=gw.links,
                )
                out[s] = first
            else:
                out[s] = _same_but(first, s, peers, urls[s])
        return out

    def _link_spec(self, a: str, b: str) -> LinkSpec:
        spec: LinkSpec = self.sc.network
        for o in self.sc.links:
            if {o.a, o.b} == {a, b}:
                spec = o
        return spec

    def _profile(self) -> dict[tuple[str, str], BandwidthTrace]:
        """Seed-002 profile traces for every plan edge (both directions share one)."""
        prof = self.sc.profile
        if prof.kind == "none":
            return {}
        edges = sorted({(min(s, n), max(s, n)) for s in self.names for n in self.plan.neighbours(s)})
        if not edges:
            return {}
        straggler = 0
        if prof.straggler:
            parent = self.plan.parent_of(prof.straggler)
            want = [e for e in edges if prof.straggler in e and (parent is None or parent in e)]
            straggler = edges.index(want[0]) if want else 0
        traces = profile_traces(
            prof.kind,
            len(edges),
            base_bps=self.sc.network.rate_bps,
            duration_s=prof.duration_s,
            step_s=prof.step_s,
            seed=self.sc.seed,
            straggler=straggler,
            slowdown=prof.slowdown,
            sigma=prof.sigma,
            burst_factor=prof.burst_factor,
            burst_prob=prof.burst_prob,
        )
        return dict(zip(edges, traces, strict=True))

    def _connect(self, a: str, b: str, profile: dict[tuple[str, str], BandwidthTrace]) -> None:
        """The real handshake (a dials: the smaller name), then ``link_up`` on both sides at t = 0."""
        na, nb = self.nodes[a], self.nodes[b]
        secret = SECRET.encode()
        ca = Connection(
            Role.GATEWAY, a, JOB, secret, side="client", registry=GATEWAY_REGISTRY,
            nonce_source=self._nonce, peer=b,
        )  # fmt: skip
        cb = Connection(
            Role.GATEWAY, b, JOB, secret, side="server", registry=GATEWAY_REGISTRY,
            nonce_source=self._nonce, peer=a,
        )  # fmt: skip
        ours_a = na.link_info(b)
        cb.receive_data(ca.hello(ours_a))
        hello = cb.next_event()
        assert isinstance(hello, Hello)
        problem = nb.dialer_problem(hello)
        if problem is not None:
            raise SimulationStuck(f"gateway {b} refused {a}: {problem}")
        ours_b = nb.link_info(a)
        ca.receive_data(cb.accept(ours_b))
        welcome = ca.next_event()
        assert isinstance(welcome, Welcome)
        cb.receive_data(ca.authenticate())
        auth = cb.next_event()
        assert isinstance(auth, Auth)
        now = self.loop.now
        la = na.link_up(b, ca, ours_a, dict(welcome.info), now)
        lb = nb.link_up(a, cb, ours_b, dict(hello.info), now)
        spec = self._link_spec(a, b)
        trace = profile.get((a, b))
        if trace is None and spec.trace is not None:
            trace = _load_trace(spec.trace)
        for src, dst, link_src, link_dst in ((a, b, la, lb), (b, a, lb, la)):
            model = LinkModel(
                src,
                dst,
                rate_bps=spec.rate_bps,
                delay_s=spec.delay_s,
                jitter_s=spec.jitter_s,
                loss=spec.loss,
                buffer_bytes=spec.buffer_bytes,
                trace=trace,
                rng=np.random.default_rng([self.sc.seed, 5, self.index[src], self.index[dst]]),
                scale=self._pacer_scale(src, link_src) if spec.follow_pacer else None,
            )
            self._links[(src, dst)] = model
            self._dirs[(src, link_src)] = _Dir(src, link_src, model, dst, link_dst)
        self._after(a)
        self._after(b)

    def _nonce(self, n: int) -> bytes:
        return self._rng.bytes(n)

    def _pacer_scale(self, site: str, link_id: int) -> Callable[[], float]:
        node = self.nodes[site]
        base = self.sc.gateway.link_rate_bps

        def scale() -> float:
            ch = node.channel(link_id)
            return 1.0 if ch is None else ch.pacer.rate_bps / base

        return scale

    def setup(self) -> None:
        """Nodes, links (handshakes at t = 0), trainers; the first iterations are scheduled.

        The cycle collector is paused meanwhile: building 1 000 nodes allocates millions of long-lived
        objects and nothing cyclic to collect, and every generation-2 pass over them cost a tenth of a
        second (half of the set-up). See :func:`frozen_world` for the run."""
        resume = gc.isenabled()
        gc.disable()
        try:
            self._build()
        finally:
            if resume:
                gc.enable()

    def _build(self) -> None:
        for s, cfg in self._configs().items():
            node = GatewayNode(cfg, 0.0, on_action=functools.partial(self._saw_action, s))
            node.start(0.0)
            node.trainer_connected(SESSION)
            self.nodes[s] = node
        profile = self._profile()
        for a, b in self.link_pairs():
            self._connect(a, b, profile)
        for s in self.names:
            self._after(s)
            self.trainers[s] = TrainerState(
                s, self.index[s], len(self.sizes), self.sc.iterations, self.sc.staleness
            )
            self._unfinished += 1
            self.loop.at(0.0, self._maybe_start, s)
        if self.sc.sample_interval_s > 0:
            self.loop.at(0.0, self._sample)

    # ------------------------------------------------------------------------------------------------
    # running
    # ------------------------------------------------------------------------------------------------

    def run(self) -> SimResult:
        t0 = self.clock() if self.clock is not None else 0.0
        self.setup()
        with frozen_world():
            self.loop.run(until=self.sc.max_time_s, stop=self._done)
        if self.sc.sample_interval_s > 0:
            self._sample_once()  # the state at the end, whatever the sampling period
        wall = (self.clock() - t0) if self.clock is not None else 0.0
        if self._unfinished:
            self.problems.append(
                f"{self._unfinished} site(s) did not finish by t={self.loop.now:.3f} s (virtual)"
            )
        return self.result(wall)

    def _done(self) -> bool:
        return self._unfinished == 0

    def result(self, wall_s: float) -> SimResult:
        links = {
            k: LinkResult(m.src, m.dst, m.bytes_total, m.writes, m.lost_writes, m.busy_s, m.series)
            for k, m in self._links.items()
        }
        for k, pacer in self._pacer_series.items():
            links[k].pacer_bps = pacer
        return SimResult(
            scenario=self.sc.name,
            seed=self.sc.seed,
            sites=self.names,
            iterations=self.sc.iterations,
            layers=len(self.sizes),
            finished=self._unfinished == 0,
            virtual_s=self.loop.now,
            events=self.loop.events_run,
            wall_s=wall_s,
            iteration_start={s: list(t.started) for s, t in self.trainers.items()},
            iteration_done={s: dict(t.completed) for s, t in self.trainers.items()},
            first_push=dict(self.first_push),
            last_delivery=dict(self.last_delivery),
            round_closed=list(self.round_closed),
            links=links,
            frontier=self.frontier,
            aggregates=dict(self.aggregates),
            problems=list(self.problems),
        )

    # -- the node driver ----------------------------------------------------------------------------

    def _after(self, site: str) -> None:
        """After every call into a node: carry out its actions and arm its timer (GatewayDaemon._after)."""
        node = self.nodes[site]
        for action in node.pop_actions():
            if type(action) is Wake:
                d = self._dirs.get((site, action.link_id))
                if d is not None and not d.done and not d.blocked:
                    self._pump(d)
            elif type(action) is ToTrainer:
                self._to_trainer(site, action.msg)
            elif type(action) is CloseLink:
                self._close(site, action)
            elif type(action) is RefuseTrainer:
                self.problems.append(f"{site}: trainer refused: {action.reason}")
        due = node.next_deadline()
        if due is not None:
            armed = self._timer_at.get(site)
            if armed is None or due < armed:
                self._timer_at[site] = due
                self.loop.at(due, self._tick, site, due)

    def _tick(self, site: str, at: float) -> None:
        if self._timer_at.get(site) != at:
            return  # superseded by an earlier timer, which re-armed
        del self._timer_at[site]
        node = self.nodes[site]
        due = node.next_deadline()
        if due is not None and due <= self.loop.now:
            node.tick(self.loop.now)
        self._after(site)

    def _pump(self, d: _Dir) -> None:
        """The link writer (PeerLink._write): write while the send buffer has room."""
        node = self.nodes[d.site]
        now = self.loop.now
        model = d.model
        while True:
            if not model.has_room(now):
                d.blocked = True
                self.loop.at(model.room_at(), self._unblock, d)
                return
            out = node.poll_link(d.link_id, now)
            if out.parts:
                data = _joined(out.parts)
                timing = model.write(len(data), now)
                self.loop.at(timing.arrival, self._arrive, d, data)
                ch = node.channel(d.link_id)
                if ch is not None and not (ch.pending() or ch.bye_sent or ch.ended):
                    # poll_link would now answer "nothing, no pacing wait" (the test pop_actions uses for
                    # a Wake): the daemon's writer would wait for a Wake, and so does this one. One poll
                    # fewer per write, ~3 % of a 1 000-site round.
                    return
                continue
            if out.done:
                d.done = True
                return
            if out.wait_until is not None and d.timer_at != out.wait_until:
                d.timer_at = out.wait_until
                self.loop.at(out.wait_until, self._paced, d, out.wait_until)
            return

    def _paced(self, d: _Dir, at: float) -> None:
        if d.timer_at != at or d.done:
            return
        d.timer_at = None
        if not d.blocked:
            self._pump(d)

    def _unblock(self, d: _Dir) -> None:
        d.blocked = False
        if not d.done:
            self._pump(d)

    def _arrive(self, d: _Dir, data: bytes) -> None:
        node = self.nodes[d.dst]
        node.link_data(d.dst_link, data, self.loop.now)
        self._after(d.dst)

    def _close(self, site: str, action: CloseLink) -> None:
        """A node ended a link: the peer sees the connection close one delay later."""
        self.problems.append(f"{site}: link {action.link_id} closed: {action.reason}")
        d = self._dirs.get((site, action.link_id))
        node = self.nodes[site]
        node.link_closed(action.link_id, action.reason, self.loop.now)
        if d is None:
            return
        d.done = True
        self.loop.after(d.model.delay_s, self._peer_closed, d, action.reason)

    def _peer_closed(self, d: _Dir, reason: str) -> None:
        peer = self.nodes[d.dst]
        peer.link_closed(d.dst_link, f"connection closed by {d.site}: {reason}", self.loop.now)
        back = self._dirs.get((d.dst, d.dst_link))
        if back is not None:
            back.done = True
        self._after(d.dst)

    def _saw_action(self, site: str, action: Action) -> None:
        if type(action) is RoundClosed:
            self.round_closed.append(
                (site, action.iteration, action.layer, action.duration, len(action.missing), action.delivered)
            )

    # -- trainers -----------------------------------------------------------------------------------

    def _maybe_start(self, site: str) -> None:
        tr = self.trainers[site]
        it = tr.next_ready()
        if it is None:
            return
        now = self.loop.now
        tr.computing = it
        tr.started.append(now)
        c = self.compute.time(site, it)
        bf = self.sc.compute.backward_fraction
        n = len(self.sizes)
        for layer in reversed(range(n)):  # a backward pass produces the last layer first
            self.loop.at(now + c * (1 - bf) + c * bf * (n - layer) / n, self._push, site, it, layer)
        self.loop.at(now + c, self._computed, site, it)

    def _computed(self, site: str, it: int) -> None:
        tr = self.trainers[site]
        tr.computed = it
        tr.computing = None
        self._maybe_start(site)

    def _push(self, site: str, it: int, layer: int) -> None:
        node = self.nodes[site]
        now = self.loop.now
        if not node.joined:  # the daemon holds pushes until the gateway joined (flow control)
            self.loop.after(0.001, self._push, site, it, layer)
            return
        p = self.sc.payload
        payload = make_payload(
            self.sc.seed,
            self.index[site],
            it,
            layer,
            dense_len=self.sizes[layer],
            density=p.density,
            block_size=p.block_size,
            same_blocks=p.same_blocks,
        )
        self.first_push.setdefault((it, layer), now)
        try:
            node.trainer_push(SESSION, Push(JOB, it, layer, 0, site, payload), now)
        except WanrtError as exc:
            self.problems.append(f"{site}: push ({it}, {layer}) refused: {exc}")
        self._after(site)

    def _to_trainer(self, site: str, msg: object) -> None:
        if not isinstance(msg, Aggregate):
            return  # push acks, config updates: nothing for the stand-in to do
        key = (site, msg.iteration, msg.layer)
        now = self.loop.now
        if key in self.aggregates:
            return  # a re-sent aggregate (after a reconnect): already counted
        self.aggregates[key] = (now, payload_digest(msg.payload), len(msg.sites))
        if self.payloads is not None:
            self.payloads[key] = msg.payload
        self.last_delivery[(msg.iteration, msg.layer)] = now
        self.nodes[site].trainer_ack(Ack(msg.iteration, msg.layer, 0))
        tr = self.trainers[site]
        was_finished = tr.finished
        if tr.aggregate(msg.iteration, now):
            if tr.finished and not was_finished:
                self._unfinished -= 1
            self.loop.at(now, self._maybe_start, site)

    # -- sampling -----------------------------------------------------------------------------------

    @functools.cached_property
    def _pacer_series(self) -> dict[tuple[str, str], list[float]]:
        return {k: [] for k in self._links}

    def _sample(self) -> None:
        self._sample_once()
        if self._unfinished:
            self.loop.after(self.sc.sample_interval_s, self._sample)

    def _sample_once(self) -> None:
        now = self.loop.now
        for (site, link_id), d in self._dirs.items():
            ch = self.nodes[site].channel(link_id)
            d.model.sample(now)
            self._pacer_series[(d.model.src, d.model.dst)].append(
                float("nan") if ch is None else ch.pacer.rate_bps
            )
        for s, node in self.nodes.items():
            ts, fs = self.frontier[s]
            ts.append(now)
            fs.append(-1 if node.engine is None else node.engine.frontier)


#: Cycle-collector thresholds while a world runs (the collector is off for the run unless a caller turned
#: it on). With the defaults (700, 10, 10) a 1 000-site run made ~35 collections per simulated round,
#: 0.09 s of its ~0.9 s of CPU, walking the new long-lived state (round results, link times, retained
#: aggregates) again and again, and found nothing: 10 simulated rounds leave no cyclic garbage at all.
RUN_GC_THRESHOLDS: Final = (50_000, 20, 100)


@contextlib.contextmanager
def frozen_world(kernels: str = "numpy") -> Iterator[None]:
    """Run a built world with everything allocated so far exempt from cycle collection (``gc.freeze``),
    and the payload codec's kernel path pinned to ``kernels`` unless ``WANRT_KERNELS`` already forces one.

    The world's objects live as long as the run; without this every generation-2 collection walks all of
    them (a million objects at 1 000 sites: a third of a second each, ~1 s per simulated round). They are
    handed back to the collector afterwards, so a dropped simulation is still reclaimed. Meanwhile the
    collector is off (a run makes no cyclic garbage; see :data:`RUN_GC_THRESHOLDS`, in force if a
    callback turns it back on).

    Why pin the codec: unforced, the first payload of 4 096 values (a 1 000-site tree's result) starts
    compiling the fused kernels in a background thread (``wanrt.codec.kernel_choice``), which fights the
    simulator for the GIL for seconds: at 1 000 sites the first rounds ran at two thirds of their speed
    (1.5 s of CPU per round against 1.06 s pinned). Both paths give bit-identical bytes (the codec's tests
    check it), so the simulated gateways decide exactly the same; ``sims.netns`` pins its daemons the
    same way."""
    saved = os.environ.get(KERNEL_ENV)
    if not (saved or "").strip():
        os.environ[KERNEL_ENV] = kernels
    thresholds = gc.get_threshold()
    enabled = gc.isenabled()
    gc.freeze()
    gc.set_threshold(*RUN_GC_THRESHOLDS)
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
        gc.set_threshold(*thresholds)
        gc.unfreeze()
        if saved is None:
            os.environ.pop(KERNEL_ENV, None)
        else:
            os.environ[KERNEL_ENV] = saved


@functools.lru_cache(maxsize=64)
def _load_trace(path: str) -> BandwidthTrace:
    return BandwidthTrace.load(path)


def _same_but(first: GatewayConfig, site: str, peers: dict[str, str], listen: str) -> GatewayConfig:
    """``first`` for another site of the same generated job.

    Every field but the site's name, its peer map and its addresses is the same validated value, so
    the per-site checks are not run again: at 1 000 sites they parse a million peer URLs.
    """
    import copy
    from types import MappingProxyType

    cfg = copy.copy(first)
    object.__setattr__(cfg, "site", site)
    object.__setattr__(cfg, "peers", MappingProxyType(peers))
    object.__setattr__(cfg, "listen", listen)
    object.__setattr__(cfg, "trainer_listen", f"unix:///sim/t{site}")
    return cfg


def run_scenario(sc: Scenario, *, clock: Callable[[], float] | None = None) -> SimResult:
    return Simulation(sc, clock=clock).run()


def _joined(parts: list[memoryview]) -> bytes:
    """The bytes of one write. A lone part that views a whole ``bytes`` object (a frame that fits one
    chunk is queued joined) is that object: no second copy of a result sent to each child."""
    if len(parts) == 1:
        obj = parts[0].obj
        if type(obj) is bytes and len(obj) == parts[0].nbytes:
            return obj
    return b"".join(parts)
