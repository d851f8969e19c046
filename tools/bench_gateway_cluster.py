"""In-process gateway clusters for ``tools/bench_gateway.py``: real daemons, a timing trainer, payloads.

Why in-process: the benchmark must time events *inside* the gateways (when the round engine decided to send
a message, when the peer's gateway had decoded it) and must reach each link's emulated WAN shaper to apply
link slowdowns and the rate allocator's decisions. :class:`BenchDaemon` is the real
:class:`~gateways.service.daemon.GatewayDaemon`, subclassed only to *observe*: it records the shaped
transport each
link was built on (``link_up``, the daemon's own link-manager callback) and the arrival time of every round
message (the node's ``on_message`` hook), then defers to the daemon unchanged. Everything else —
handshakes, round
engine, EDF queue, pacer, rate allocator, protocol framing — is the daemon's own code.

:class:`BenchTrainer` is a site leader reduced to what a benchmark needs: it speaks the real trainer protocol
over the real trainer socket, pushes payloads when told to, acknowledges every ``Aggregate`` and timestamps
its arrival.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gateways.config import EdfConfig, GatewayConfig, PeerShape, RateConfig
from gateways.rounds.actions import Action, Send
from gateways.rounds.config import RoundConfig
from gateways.service.daemon import GatewayDaemon
from gateways.service.peer_link import PeerLink
from transports import ShapedTransport, Timeouts, Transport, connect
from transports.urls import short_socket_dir
from wanrt.errors import PeerLost
from wanrt.payload import SparsePayload, n_blocks
from wanrt.protocol import (
    NEED_DATA,
    Ack,
    Aggregate,
    Bye,
    Connection,
    ConnectionClosed,
    Error,
    Push,
    Welcome,
)
from wanrt.protocol.peer.round_msg import RoundMsg

JOB = "bench"
SECRET = "bench-secret-0123456789"
BLOCK = 16  # StellaTrain's cache-aware blocks of 16 floats

#: Liveness settings for a benchmark: a loaded 2-core machine must never make a gateway declare a peer lost
#: or skip a site mid-measurement, so every deadline is far beyond any measured transfer.
BENCH_TIMEOUTS = Timeouts(connect=10.0, handshake=10.0, send=120.0, close=2.0, heartbeat_interval=5.0)


def now() -> float:
    """The one clock of the benchmark (the event loop's clock is ``time.monotonic`` as well)."""
    return time.monotonic()


# -- payloads ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def payload_of(layer: int, dense_len: int, density: float, seed: int = 0) -> SparsePayload:
    """A COO payload selecting ``density`` of the blocks of a ``dense_len`` layer (fp32, blocks of 16).

    The block set depends on (layer, seed) only: sites given the same seed select the same blocks (the
    aggregate is then as large as one contribution), different seeds give different blocks (the aggregate
    is their union, as with top-k compression of different gradients). Cached: building one costs
    milliseconds that must not land inside a timed iteration; nobody mutates a payload.
    """
    rng = np.random.default_rng(1000 * seed + layer)
    nb = n_blocks(dense_len, BLOCK)
    k = max(1, min(nb, round(density * nb)))
    idx = np.sort(rng.choice(nb, size=k, replace=False)).astype(np.int64) if k < nb else np.arange(nb)
    if dense_len % BLOCK and int(idx[-1]) == nb - 1:
        idx = idx[:-1] if len(idx) > 1 else np.zeros(1, np.int64)  # keep the padded tail block out
    values = rng.standard_normal(len(idx) * BLOCK).astype(np.float32)
    return SparsePayload(layer, dense_len, BLOCK, idx.astype(np.int64), values)


def payload_bytes(p: SparsePayload) -> int:
    """Application bytes of a payload: its COO indices and values (what a raw sender would have to move)."""
    return int(p.indices.nbytes + p.values.nbytes)


# -- the observing daemon ---------------------------------------------------------------------------------


@dataclass
class Observed:
    """What :class:`BenchDaemon` saw: send decisions and round-message arrivals, with times."""

    sends: list[tuple[float, str, int, int]] = field(default_factory=list)  # (t, peer, iteration, layer)
    arrivals: list[tuple[float, str, str, int, int]] = field(default_factory=list)  # (t, peer, kind, it, l)
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class BenchDaemon(GatewayDaemon):
    """A :class:`GatewayDaemon` that records its links' shapers and round-message times (see module doc)."""

    def __init__(self, cfg: GatewayConfig) -> None:
        self.observed = Observed()
        self.shapers: dict[str, ShapedTransport] = {}
        super().__init__(cfg, on_action=self._saw_action, on_message=self._saw_message)

    def _saw_action(self, action: Action) -> None:
        if isinstance(action, Send):
            self.observed.sends.append((now(), action.peer, action.msg.iteration, action.msg.layer))

    def link_up(
        self, peer: str, conn: Connection, transport: Transport, ours: dict[str, Any], theirs: dict[str, Any]
    ) -> PeerLink:
        link = super().link_up(peer, conn, transport, ours, theirs)
        if isinstance(transport, ShapedTransport):
            self.shapers[peer] = transport
        return link

    def _saw_message(self, peer: str, msg: RoundMsg) -> None:
        self.observed.arrivals.append((now(), peer, msg.kind, msg.iteration, msg.layer))
        self.observed.changed.set()

    async def wait_arrival(self, pred: Callable[[list[tuple[float, str, str, int, int]]], bool]) -> None:
        while not pred(self.observed.arrivals):
            self.observed.changed.clear()
            await self.observed.changed.wait()


# -- the timing trainer -----------------------------------------------------------------------------------


class BenchTrainer:
    """A site leader speaking the real trainer protocol; timestamps every Aggregate it receives."""

    def __init__(self, url: str, site: str, job: str = JOB, secret: bytes = SECRET.encode()) -> None:
        self.url, self.site, self.job, self.secret = url, site, job, secret
        self.arrived: dict[tuple[int, int], float] = {}
        self.errors: list[str] = []
        self._conn: Connection | None = None
        self._transport: Transport | None = None
        self._reader: asyncio.Task[None] | None = None
        self._progress = asyncio.Event()

    async def connect(self) -> None:
        transport = await connect(self.url)
        conn = Connection("trainer", self.site, self.job, self.secret, side="client", peer=self.url)
        await transport.send([conn.hello({})])
        event = await _next(conn, transport)
        if not isinstance(event, Welcome):
            await transport.close()
            raise RuntimeError(f"trainer {self.site}: no Welcome from its gateway: {event!r}")
        await transport.send([conn.authenticate()])
        self._conn, self._transport = conn, transport
        self._reader = asyncio.get_running_loop().create_task(self._read(), name=f"trainer {self.site}")

    async def push(self, iteration: int, layer: int, payload: SparsePayload) -> None:
        assert self._conn is not None and self._transport is not None
        msg = Push(self.job, iteration, layer, 0, self.site, payload)
        await self._transport.send(self._conn.send_parts(msg))

    async def wait_for(self, keys: list[tuple[int, int]], timeout: float = 300.0) -> float:
        """Until the aggregates of every (iteration, layer) in ``keys`` arrived; returns the last arrival.

        Raises if the gateway closed the connection, or after ``timeout`` (a benchmark must not hang).
        """
        async with asyncio.timeout(timeout):
            while not all(k in self.arrived for k in keys):
                if self.errors:
                    raise RuntimeError(f"trainer {self.site}: {self.errors[-1]}")
                self._progress.clear()
                await self._progress.wait()
        return max(self.arrived[k] for k in keys)

    def done_through(self, iteration: int, layers: int) -> bool:
        return all((iteration, layer) in self.arrived for layer in range(layers))

    def on_aggregate(self, event: Aggregate) -> None:
        """Each Aggregate as it arrives, before it is acknowledged (subclasses keep more of it)."""

    async def _read(self) -> None:
        conn, transport = self._conn, self._transport
        assert conn is not None and transport is not None
        try:
            while True:
                event = await _next(conn, transport)
                if isinstance(event, Aggregate):
                    self.arrived.setdefault((event.iteration, event.layer), now())
                    self.on_aggregate(event)
                    await transport.send(conn.send_parts(Ack(event.iteration, event.layer, event.round)))
                    self._progress.set()
                elif isinstance(event, (Bye, Error, ConnectionClosed)):
                    self.errors.append(repr(event))
                    self._progress.set()
                    return
        except (PeerLost, OSError, ConnectionError) as exc:
            self.errors.append(repr(exc))
            self._progress.set()

    async def close(self) -> None:
        if self._transport is None or self._conn is None:
            return
        with contextlib.suppress(Exception):
            await self._transport.send([self._conn.send(Bye("done"))])
        if self._reader is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._reader), 2.0)
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        await self._transport.close()


async def _next(conn: Connection, transport: Transport) -> Any:
    while True:
        event = conn.next_event()
        if event is not NEED_DATA:
            return event
        data = await transport.recv()
        conn.receive_data(data)
        if not data:
            return conn.next_event()


# -- clusters ---------------------------------------------------------------------------------------------


def short_dir() -> contextlib.AbstractContextManager[Path]:
    """A short temporary directory for the daemons' unix sockets (see transports.urls.short_socket_dir)."""
    return short_socket_dir("wgb")


def star_configs(
    sock_dir: Path,
    sites: str,
    *,
    shaping: Mapping[tuple[str, str], PeerShape],
    edf: EdfConfig | None = None,
    rates: RateConfig | None = None,
    link_rate_bps: float = 100e6,
) -> dict[str, GatewayConfig]:
    """One config per site of a star rooted at the first site; ``shaping[(src, dst)]`` shapes src → dst."""
    names = sorted(sites)
    rounds = RoundConfig(topology="star", round_deadline_s=120.0, t_w_s=120.0, suspect_after_s=120.0)
    out = {}
    for s in names:
        out[s] = GatewayConfig(
            site=s,
            job=JOB,
            secret=SECRET,
            listen=f"unix://{sock_dir}/g{s}.sock",
            trainer_listen=f"unix://{sock_dir}/t{s}.sock",
            peers={p: f"unix://{sock_dir}/g{p}.sock" for p in names if p != s},
            root=names[0],
            reconnect_initial_s=0.05,
            reconnect_max_s=0.2,
            shutdown_deadline_s=5.0,
            link_rate_bps=link_rate_bps,
            rounds=rounds,
            edf=edf or EdfConfig(),
            rates=rates or RateConfig(),
            timeouts=BENCH_TIMEOUTS,
            shaping={dst: shape for (src, dst), shape in shaping.items() if src == s},
        )
    return out


class Cluster:
    """Running :class:`BenchDaemon` s (one task each) and a connected :class:`BenchTrainer` per site."""

    def __init__(self, configs: dict[str, GatewayConfig]) -> None:
        self.configs = configs
        self.daemons: dict[str, BenchDaemon] = {}
        self.trainers: dict[str, BenchTrainer] = {}
        self._tasks: list[asyncio.Task[dict[str, Any]]] = []

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        for s in sorted(self.configs, reverse=True):  # listeners first, so dialers find them at once
            d = BenchDaemon(self.configs[s])
            ready = asyncio.Event()
            task = loop.create_task(d.run(on_ready=ready.set), name=f"gateway {s}")
            self._tasks.append(task)
            waiter = loop.create_task(ready.wait())
            await asyncio.wait([waiter, task], timeout=60, return_when=asyncio.FIRST_COMPLETED)
            if not ready.is_set():
                waiter.cancel()
                if task.done():
                    task.result()  # raises what start() raised
                raise RuntimeError(f"gateway {s} not listening after 60 s")
            self.daemons[s] = d
        async with asyncio.timeout(30):
            for d in self.daemons.values():
                await d.wait_for(lambda d=d: len(d.shapers) + _unshaped_links(d) == len(d.cfg.peers))  # type: ignore[misc]
                await d.wait_joined()
        for s, cfg in self.configs.items():
            t = BenchTrainer(cfg.trainer_listen, s)
            await t.connect()
            self.trainers[s] = t

    def diagnose(self) -> str:
        """Each gateway's view (frontier, open rounds, queues, links) and each trainer's progress."""
        lines = []
        for s, d in self.daemons.items():
            st = d.status()
            peers = {p: (v["state"], v["queue_items"], v["queue_bytes"]) for p, v in st["peers"].items()}
            lines.append(
                f"gateway {s}: {st['state']} frontier {st['frontier']} open {st['open_rounds']} "
                f"queue {st['queue']} peers {peers}"
            )
        for s, t in self.trainers.items():
            newest = max(t.arrived, default=None)
            lines.append(f"trainer {s}: {len(t.arrived)} aggregates, newest {newest}, errors {t.errors[-2:]}")
        return "\n".join(lines)

    async def stop(self) -> None:
        for t in self.trainers.values():
            await t.close()
        for d in self.daemons.values():
            d.request_stop()
        if self._tasks:  # phased shutdown has its own deadlines; this only guards the benchmark itself
            _, late = await asyncio.wait(self._tasks, timeout=60)
            for task in late:
                task.cancel()
        results = await asyncio.gather(*self._tasks, return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError):
                raise r


def _unshaped_links(d: BenchDaemon) -> int:
    """Peers whose link is up without shaping (the status view lists every peer's state)."""
    peers = d.status()["peers"]
    return sum(1 for p, st in peers.items() if st["state"] == "up" and p not in d.shapers)


@contextlib.asynccontextmanager
async def running(configs: dict[str, GatewayConfig]) -> AsyncIterator[Cluster]:
    cluster = Cluster(configs)
    try:
        await cluster.start()
        yield cluster
    finally:
        await cluster.stop()
