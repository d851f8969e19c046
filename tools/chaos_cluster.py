"""The daemons of the chaos soak: real in-process :class:`GatewayDaemon` s, one task each, on unix sockets
behind emulated WAN links; of a replaced generation only its ledger counters are kept for the accounting.

Like tools/harness/daemon_cluster.py's ``Cluster``, with generations and links it can cut: killing a
gateway cancels its task (every socket dropped, no Bye, as if the process died); restarting builds a new
daemon from the same config, whose ``state_file`` lets gateways restarted together resume the job. Every
round-engine action is recorded with the loop time, per site across generations, so the soak can measure
when a restarted site delivered its first round and count every contribution of every delivered result.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import socket
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gateways.config import GatewayConfig, PeerShape
from gateways.membership.trainer_ledger import LedgerStats
from gateways.rounds.actions import Action, Deliver
from gateways.rounds.config import RoundConfig
from gateways.service.daemon import GatewayDaemon
from transports import ShapedTransport, Timeouts

#: the site whose gateway task runs (copied into every task it starts): the soak's ``-v`` log names it
LOG_SITE: contextvars.ContextVar[str] = contextvars.ContextVar("chaos_site", default="-")

JOB = "chaos"
SECRET = "chaos-s3cret-s3cret-0123"
CONTROL_TOKEN = "chaos-control-token-0123456789"

#: fast failure detection (a dead peer is noticed within 3 s) and reconnects; generous send/connect limits
#: so that a loaded 2-core machine does not turn load into failures the soak would blame on the runtime
SOAK_TIMEOUTS = Timeouts(
    connect=5.0, handshake=5.0, send=30.0, close=2.0, heartbeat_interval=0.5, heartbeat_misses=6
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def soak_configs(
    sock_dir: Path,
    sites: str,
    *,
    rate_bps: float,
    delay_s: float,
    rounds: RoundConfig,
    control_site: str,
) -> dict[str, GatewayConfig]:
    """One config per site: full mesh on unix sockets, every link shaped, a state file each; the
    ``control_site`` gateway also serves HTTP control with a token file."""
    token = sock_dir / "control-token"
    token.write_text(CONTROL_TOKEN + "\n")
    names = sorted(sites)
    out = {}
    for s in names:
        peers = {p: f"unix://{sock_dir}/g{p}.sock" for p in names if p != s}
        out[s] = GatewayConfig(
            site=s,
            job=JOB,
            secret=SECRET,
            listen=f"unix://{sock_dir}/g{s}.sock",
            trainer_listen=f"unix://{sock_dir}/t{s}.sock",
            peers=peers,
            reconnect_initial_s=0.05,
            reconnect_max_s=0.5,
            shutdown_deadline_s=5.0,
            rounds=rounds,
            timeouts=SOAK_TIMEOUTS,
            shaping={p: PeerShape(rate_bps, delay_s=delay_s) for p in peers},
            state_file=str(sock_dir / f"state-{s}.json"),
            # the stand-in trainers' "trainer_kill" is a reconnect of the same run that re-sends its
            # unacknowledged pushes (a trainer that checkpoints them); empty pushes made for it meanwhile
            # would take those pushes' places. A crash of a real trainer is a new run (tools/chaos_real.py)
            trainer_gone_grace_s=60.0,
        )
        if s == control_site:
            out[s] = dataclasses.replace(out[s], metrics_port=free_port(), control_token_file=str(token))
    return out


@dataclass
class Version:
    """One distinct result delivered for a round: its payload once, and which sites delivered it."""

    result: Deliver
    sites: list[str] = field(default_factory=list)


#: rounds this many iterations behind the newest delivered one are settled: their result (the one most
#: sites delivered) is added into per-layer sums and its payload dropped, so the harness's memory stays flat
#: and the RSS metric measures the daemons. A result delivered for a round after that is still compared.
SETTLE_LAG = 200


def grow_count(counts: dict[tuple[str, int], bytearray], site: str, layer: int, it: int) -> None:
    arr = counts.setdefault((site, layer), bytearray())
    if it >= len(arr):
        arr.extend(bytes(it + 1 - len(arr) + 256))
    arr[it] = min(255, arr[it] + 1)


class Accounting:
    """Every delivered result of every site and generation, folded as rounds settle: per layer the dense
    sum of the job's results, and per (site, layer) how often each contribution id was counted."""

    def __init__(self, layers: int, dense_len: Callable[[int], int]) -> None:
        self.sums = [np.zeros(dense_len(layer), np.float32) for layer in range(layers)]
        self.counts: dict[tuple[str, int], bytearray] = {}
        self.open: dict[tuple[int, int], dict[int, Version]] = {}
        # per layer, per iteration: the digest (crc32) of the job's result once settled, -1 before. An array
        # (8 bytes a round), not a dict of (iteration, layer) -> int (≈ 150 bytes a round: 1.8 MB over a
        # full soak's 3 000 iterations, counted as the daemons' RSS growth)
        self.settled = [np.full(0, -1, np.int64) for _ in range(layers)]
        self.conflicts: list[str] = []
        self.minority: set[str] = set()
        self.newest = -1
        self._settled_below = 0

    def record(self, site: str, d: Deliver) -> None:
        key = (d.iteration, d.layer)
        dig = digest(d)
        settled = self.settled_digest(*key)
        if settled >= 0:
            if settled != dig:
                self.conflicts.append(f"{key}: {site} delivered {_ids(d)} after the round was settled")
                self.minority.add(site)
            return
        v = self.open.setdefault(key, {}).setdefault(dig, Version(d))
        v.sites.append(site)
        if d.iteration > self.newest:
            self.newest = d.iteration
            if self.newest - SETTLE_LAG >= self._settled_below + 16:
                self.settle(self.newest - SETTLE_LAG)

    def settle(self, below: int | None = None) -> None:
        """Fold every open round below ``below`` (all of them if None)."""
        for key in sorted(k for k in self.open if below is None or k[0] < below):
            ranked = sorted(self.open.pop(key).values(), key=lambda v: (-len(v.sites), v.sites))
            best = ranked[0].result
            self._settle_digest(key, digest(best))
            if best.payload is not None:
                best.payload.add_into(self.sums[key[1]])
            for s, it in best.sites:
                grow_count(self.counts, s, key[1], it)
            if len(ranked) > 1:
                self.conflicts.append(
                    f"{key}: " + " vs ".join(f"{''.join(v.sites)} got {_ids(v.result)}" for v in ranked)
                )
                for v in ranked[1:]:
                    self.minority.update(v.sites)
        if below is not None:
            self._settled_below = below

    def settled_digest(self, iteration: int, layer: int) -> int:
        """The digest of the round's settled result, -1 if it is not settled."""
        arr = self.settled[layer] if 0 <= layer < len(self.settled) else None
        return int(arr[iteration]) if arr is not None and 0 <= iteration < len(arr) else -1

    def _settle_digest(self, key: tuple[int, int], dig: int) -> None:
        it, layer = key
        arr = self.settled[layer]
        if it >= len(arr):
            grown = np.full(it + 1024, -1, np.int64)  # linear steps: a doubled array's tail is touched too
            grown[: len(arr)] = arr
            self.settled[layer] = arr = grown
        arr[it] = dig


class SoakCluster:
    """Daemons (one task each), every generation of them, and what they delivered (see Accounting)."""

    def __init__(self, configs: dict[str, GatewayConfig], accounting: Accounting) -> None:
        self.configs = configs
        self.daemons: dict[str, GatewayDaemon] = {}
        #: what the accounting needs of a replaced generation (its ledger's counters); the dead daemon itself
        #: is dropped, as a dead process's memory is: kept, 15–20 of them grew the soak's RSS by tens of MB
        self.retired_ledgers: list[LedgerStats] = []
        self.tasks: dict[str, asyncio.Task[dict[str, Any]]] = {}
        self.first_delivery: dict[str, float | None] = {}  # per site, since its latest (re)start
        self.accounting = accounting
        self.stats: dict[str, dict[str, Any]] = {}
        self._changed = asyncio.Event()

    def _record(self, site: str) -> Callable[[Action], None]:
        loop = asyncio.get_running_loop()

        def record(action: Action) -> None:
            if not isinstance(action, Deliver):
                return
            if self.first_delivery.get(site) is None:
                self.first_delivery[site] = loop.time()
            self.accounting.record(site, action)
            self._changed.set()

        return record

    async def wait_changed(self) -> None:
        self._changed.clear()
        await self._changed.wait()

    def up(self, site: str) -> bool:
        return site in self.tasks and not self.tasks[site].done()

    async def start(self, site: str) -> GatewayDaemon:
        d = GatewayDaemon(self.configs[site], on_action=self._record(site))
        self.first_delivery[site] = None
        old = self.daemons.get(site)
        if old is not None and old.ledger is not None:
            self.retired_ledgers.append(old.ledger.stats)
        self.daemons[site] = d
        started = asyncio.Event()
        ctx = contextvars.copy_context()
        ctx.run(LOG_SITE.set, site)
        task = asyncio.get_running_loop().create_task(
            d.run(on_ready=started.set), name=f"gateway {site}", context=ctx
        )
        self.tasks[site] = task
        waiter = asyncio.ensure_future(started.wait())
        await asyncio.wait([waiter, task], return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            waiter.cancel()
            task.result()
        return d

    def ledger_stats(self) -> list[LedgerStats]:
        """The ledger counters of every generation: the replaced ones and the current."""
        current = [d.ledger.stats for d in self.daemons.values() if d.ledger is not None]
        return [*self.retired_ledgers, *current]

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
            result = (await asyncio.gather(task, return_exceptions=True))[0]
            if isinstance(result, dict):
                self.stats[s] = result
        self.tasks.clear()

    async def aclose(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        self.tasks.clear()

    def shaped(self, a: str, b: str) -> list[ShapedTransport]:
        """The emulated links between ``a`` and ``b`` that exist now (each side's end of their link)."""
        out = []
        for x, y in ((a, b), (b, a)):
            if not self.up(x):
                continue
            link = self.daemons[x].links().get(y)
            if link is not None and isinstance(link.transport, ShapedTransport):
                out.append(link.transport)
        return out

    def first_delivery_since_start(self, site: str) -> float | None:
        """The loop time of the site's first delivered round since it was (re)started."""
        return self.first_delivery.get(site)


def digest(d: Deliver) -> int:
    values = b"" if d.payload is None else d.payload.values_f32().tobytes()
    return zlib.crc32(_ids(d).encode() + b"|" + values)


def _ids(d: Deliver) -> str:
    return ",".join(f"{s}{it}" for s, it in d.sites)
