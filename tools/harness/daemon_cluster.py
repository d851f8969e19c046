"""Several real gateway daemons in one process on unix sockets, with fake trainers, for the daemon tests.

Every daemon is a :class:`~gateways.service.daemon.GatewayDaemon` built from a real :class:`GatewayConfig`,
running in
its own task (cancel the task = the process died: connections dropped, no Bye). Round-engine actions are
recorded per site through the daemon's ``on_action`` hook, so tests can check contribution ids exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from gateways.config import GatewayConfig
from gateways.rounds.actions import Action, Deliver, Send
from gateways.rounds.config import RoundConfig
from gateways.service.daemon import GatewayDaemon
from tools.harness.daemon_trainer import FakeTrainer
from tools.harness.exact_payloads import layer_shape
from transports import Timeouts
from transports.urls import short_socket_dir
from wanrt.payload import SparsePayload
from wanrt.protocol.peer.round_msg import ContribId

JOB = "testjob"
SECRET = "s3cret-s3cret-s3cret"

#: fast failure detection and reconnects for tests; generous deadlines so a loaded machine never skips
TEST_TIMEOUTS = Timeouts(
    connect=5.0, handshake=5.0, send=30.0, close=2.0, heartbeat_interval=0.5, heartbeat_misses=6
)


def short_dir() -> contextlib.AbstractContextManager[Path]:
    """A short temporary directory for the daemons' unix sockets (see transports.urls.short_socket_dir)."""
    return short_socket_dir("wg")


def site_configs(
    sock_dir: Path,
    sites: Iterable[str] = "abcd",
    *,
    rounds: RoundConfig | None = None,
    **overrides: Any,
) -> dict[str, GatewayConfig]:
    names = sorted(sites)
    out = {}
    for s in names:
        kw: dict[str, Any] = {
            "site": s,
            "job": JOB,
            "secret": SECRET,
            "listen": f"unix://{sock_dir}/g{s}.sock",
            "trainer_listen": f"unix://{sock_dir}/t{s}.sock",
            "peers": {p: f"unix://{sock_dir}/g{p}.sock" for p in names if p != s},
            "reconnect_initial_s": 0.05,
            "reconnect_max_s": 0.2,
            "shutdown_deadline_s": 5.0,
            "rounds": rounds or RoundConfig(round_deadline_s=20.0, suspect_after_s=20.0),
            "timeouts": TEST_TIMEOUTS,
        }
        kw.update(overrides)
        out[s] = GatewayConfig(**kw)
    return out


class Cluster:
    """Daemons (one task each) and their recorded actions."""

    def __init__(self, configs: dict[str, GatewayConfig]) -> None:
        self.configs = configs
        self.daemons: dict[str, GatewayDaemon] = {}
        self.tasks: dict[str, asyncio.Task[dict[str, Any]]] = {}
        self.actions: dict[str, list[Action]] = {s: [] for s in configs}
        self.stats: dict[str, dict[str, Any]] = {}
        self.generation: dict[str, int] = dict.fromkeys(configs, 0)
        self._changed = asyncio.Event()

    def _record(self, site: str) -> Callable[[Action], None]:
        actions = self.actions[site]

        def record(action: Action) -> None:
            actions.append(action)
            self._changed.set()

        return record

    async def wait_action(self, site: str, pred: Callable[[list[Action]], bool]) -> None:
        """Until ``pred(actions of site)`` holds (re-checked after every recorded action)."""
        while not pred(self.actions[site]):
            self._changed.clear()
            await self._changed.wait()

    async def start(self, site: str) -> GatewayDaemon:
        d = GatewayDaemon(self.configs[site], on_action=self._record(site))
        self.daemons[site] = d
        self.generation[site] += 1
        started = asyncio.Event()
        task = asyncio.get_running_loop().create_task(d.run(on_ready=started.set), name=f"gateway {site}")
        self.tasks[site] = task
        waiter = asyncio.ensure_future(started.wait())
        await asyncio.wait([waiter, task], return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            waiter.cancel()
            task.result()  # raises what start() raised
        return d

    async def start_all(self) -> None:
        for s in sorted(self.configs, reverse=True):
            await self.start(s)

    async def kill(self, site: str) -> None:
        """As if the process died: cancel its task (every connection dropped, no Bye)."""
        task = self.tasks.pop(site)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def stop_all(self) -> None:
        for s, d in self.daemons.items():
            if s in self.tasks:
                d.request_stop()
        for s, task in list(self.tasks.items()):
            self.stats[s] = await task
        self.tasks.clear()

    async def aclose(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        self.tasks.clear()

    def delivered(self, site: str) -> dict[tuple[int, int], Deliver]:
        out: dict[tuple[int, int], Deliver] = {}
        for a in self.actions[site]:
            if isinstance(a, Deliver):
                out.setdefault((a.iteration, a.layer), a)
        return out


@contextlib.asynccontextmanager
async def running(configs: dict[str, GatewayConfig]) -> AsyncIterator[Cluster]:
    cluster = Cluster(configs)
    try:
        await cluster.start_all()
        yield cluster
    finally:
        await cluster.aclose()


def trainers_for(cluster: Cluster, *, layers: int, iterations: int, **kw: Any) -> dict[str, FakeTrainer]:
    return {
        s: FakeTrainer(
            cfg.trainer_listen, s, JOB, SECRET.encode(), layers=layers, iterations=iterations, **kw
        )
        for s, cfg in cluster.configs.items()
    }


def dense_sum(payloads: Iterable[SparsePayload], layer: int) -> np.ndarray:
    out = np.zeros(layer_shape(layer)[0], np.float32)
    for p in payloads:
        p.add_into(out)
    return out


def add_held(
    cluster: Cluster, sites: Iterable[str], layer: int, got: np.ndarray, seen: Counter[ContribId]
) -> None:
    """Add what the sites' engines and ledgers still hold of ``layer`` (nothing, once a run is over) to
    ``got``, and its contributions to ``seen``: an accounting test counts every push exactly once."""
    for s in sites:
        daemon = cluster.daemons[s]
        assert daemon.engine is not None and daemon.ledger is not None
        for p, ids in daemon.engine.held(layer):
            if p is not None:
                p.add_into(got)
            seen.update(ids)
        for _, p in daemon.ledger.held(layer):
            p.add_into(got)


def ids_of(d: Deliver) -> tuple[ContribId, ...]:
    return d.sites


def sent(actions: list[Action], iteration: int) -> set[int]:
    """Layers of ``iteration`` for which a round message was sent."""
    return {a.msg.layer for a in actions if isinstance(a, Send) and a.msg.iteration == iteration}
