"""A site leader for the chaos soak: the real trainer protocol over a real transport, with a clock.

Copied from tests/gateways/service/daemon_trainer.py (tools must not import tests/) and extended with
what the soak measures: the loop time of every event the trainer sees (an Aggregate, an Ack, a
ConfigUpdate, a Notice, a Welcome, an error), so the longest wait with no news is measured from the
trainer's own clock, a pause per iteration (``compute_s``) so a run lasts as long as the event schedule,
and :meth:`ChaosTrainer.kill`, which drops the connection as a crashed trainer would (no Bye). Pushes the
gateway has not acknowledged are kept and sent again by :meth:`ChaosTrainer.reconnect` (a trainer that
checkpoints its unacknowledged pushes). Parameter resync (docs/chaos.md) runs through the client's own
:mod:`wanrt.client.link.param_resync`: on a ``resync`` notice the trainer asks for the job's parameters,
holds the results it receives until the snapshot is in, swaps it in and applies the held results the
snapshot lacks; asked by its gateway for a peer, it answers with its parameters once it has applied every
result below the asked iteration.
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from array import array
from collections.abc import Callable
from typing import Any

import numpy as np

from sims.exact_params import ExactParams
from sims.exact_payloads import layer_shape, make_payload
from transports import Transport, connect
from wanrt.errors import PeerLost, RemoteProtocolError, WanrtError
from wanrt.payload import SparsePayload
from wanrt.protocol import (
    NEED_DATA,
    Ack,
    Aggregate,
    Bye,
    ConfigUpdate,
    Connection,
    ConnectionClosed,
    Error,
    Heartbeat,
    Notice,
    ParamAnnounce,
    ParamChunk,
    ParamRefuse,
    ParamRequest,
    Push,
    Welcome,
)

Key = tuple[int, int]


def signature_info(layers: int) -> dict[str, Any]:
    """A model signature (wanrt.client.link.signature) for ``layers`` linear layers."""
    from wanrt.client.link.signature import LayerSignature

    names = [f"layer{i}.weight" for i in range(layers)]
    return LayerSignature.of(names, [(8, 8)] * layers, ["float32"] * layers).info()


class ChaosTrainer:
    """One site's trainer: pushes every layer of an iteration (last first), at most ``staleness`` ahead."""

    def __init__(
        self,
        url: str,
        site: str,
        job: str,
        secret: bytes,
        *,
        layers: int,
        iterations: int,
        compute_s: float = 0.0,
        staleness: int = 1,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.url, self.site, self.job, self.secret = url, site, job, secret
        self.layers, self.iterations, self.staleness = layers, iterations, staleness
        self.compute_s = compute_s
        self.info = signature_info(layers)
        # what was pushed, compactly (the soak's memory metric must measure the daemons, not this record):
        # a flag per (layer, iteration) and the dense sum per layer; payloads are recomputed on demand
        self.pushed_flags = [bytearray() for _ in range(layers)]
        self.pushed_sum = [np.zeros(layer_shape(layer)[0], np.float32) for layer in range(layers)]
        self.pushes = 0
        self.unacked: dict[Key, SparsePayload] = {}
        # per layer and iteration: a fingerprint (crc of ids and values, -1: none yet) of the aggregate;
        # the payloads go into ``params`` and are dropped
        self.fingerprints = [np.full(0, -1, np.int64) for _ in range(layers)]
        self.duplicates = 0
        self.mismatched_duplicates = 0
        self.configs: list[ConfigUpdate] = []
        self.notices: list[Notice] = []
        self.errors: list[str] = []
        # when the trainer heard anything (loop time): what the silent-wait metric reads. 8 bytes an event in
        # an array, not a (time, kind) tuple in a list (~90 bytes): a full soak's 70 000 aggregates made
        # ~6 MB of this record count as the daemons' RSS growth
        self.event_times = array("d")
        self.resync_times: list[float] = []  # when a parameter snapshot was swapped in
        self.skip_below = 0
        self.next_it = 0
        # the parameters (every result applied, summed) and the resync state (sims.exact_params)
        self.state = ExactParams(layers, peer=url)
        self._clock = clock or (lambda: asyncio.get_running_loop().time())
        self._conn: Connection | None = None
        self._transport: Transport | None = None
        self._reader: asyncio.Task[None] | None = None
        self._progress = asyncio.Event()
        self._connected = asyncio.Event()
        self._allow: int | None = None
        self._allow_changed = asyncio.Event()

    # -- connection ------------------------------------------------------------------------------------

    def _event(self, kind: str) -> None:
        now = self._clock()
        self.event_times.append(now)
        if kind == "resync":
            self.resync_times.append(now)
        self._progress.set()

    async def connect(self, *, resend: bool = False) -> Welcome:
        transport = await connect(self.url)
        conn = Connection("trainer", self.site, self.job, self.secret, side="client", peer=self.url)
        await transport.send([conn.hello(self.info)])
        event = await self._next(conn, transport)
        if not isinstance(event, Welcome):
            await transport.close()
            raise RemoteProtocolError(f"no Welcome: {event!r}")
        await transport.send([conn.authenticate()])
        self._conn, self._transport = conn, transport
        for frame in self.state.connected():  # a snapshot still owed is asked for again
            await transport.send(conn.send_parts(frame))
        join_at = event.info.get("join_at", -1)
        if isinstance(join_at, int) and join_at > 0:
            self.skip_below = max(self.skip_below, join_at)
        self._event("welcome")
        self._reader = asyncio.get_running_loop().create_task(self._read(conn, transport))
        if resend:
            with contextlib.suppress(WanrtError, OSError, ConnectionError):  # still unacked: next reconnect
                for key in sorted(self.unacked):
                    await self._send(Push(self.job, key[0], key[1], 0, self.site, self.unacked[key]))
        self._connected.set()
        return event

    async def reconnect(self) -> Welcome:
        return await self.connect(resend=True)

    async def kill(self) -> None:
        """As if the trainer process crashed: the connection is aborted, no Bye."""
        transport = self._transport
        self._transport = None
        if transport is not None:
            abort = getattr(transport, "abort", None)
            if callable(abort):
                abort()
            else:
                await transport.close()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
        self._connected.clear()

    async def close(self) -> None:
        if self._transport is None:
            return
        with contextlib.suppress(Exception):
            assert self._conn is not None
            await self._transport.send([self._conn.send(Bye("done"))])
        if self._reader is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._reader), 5)
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self._transport.close()

    @staticmethod
    async def _next(conn: Connection, transport: Transport) -> Any:
        while True:
            event = conn.next_event()
            if event is not NEED_DATA:
                return event
            conn.receive_data(await transport.recv())

    async def _send(self, msg: Any) -> None:
        assert self._conn is not None and self._transport is not None
        await self._transport.send(self._conn.send_parts(msg))

    async def _read(self, conn: Connection, transport: Transport) -> None:
        try:
            while True:
                event = await self._next(conn, transport)
                if isinstance(event, Aggregate):
                    key = (event.iteration, event.layer)
                    if 0 <= event.layer < self.layers:
                        seen = self.fingerprint(*key)
                        fingerprint = _crc(event)
                        if seen >= 0:
                            self.duplicates += 1
                            self.mismatched_duplicates += seen != fingerprint
                        else:
                            self._set_fingerprint(key, fingerprint)
                            self.state.take(key, event.payload)
                    await transport.send(conn.send_parts(Ack(event.iteration, event.layer, event.round)))
                    self._event("aggregate")
                    await self._maybe_serve(conn, transport)
                elif isinstance(event, (ParamAnnounce, ParamChunk, ParamRefuse, ParamRequest)):
                    await self._on_params(event, conn, transport)
                elif isinstance(event, Ack):
                    self.unacked.pop((event.iteration, event.layer), None)
                    self._progress.set()
                elif isinstance(event, ConfigUpdate):
                    self.configs.append(event)
                    self._event("config")
                elif isinstance(event, Notice):
                    self.notices.append(event)
                    self._event("notice")
                    for frame in self.state.on_notice(event):
                        await transport.send(conn.send_parts(frame))
                elif isinstance(event, Heartbeat):
                    continue
                elif isinstance(event, (Bye, Error, ConnectionClosed)):
                    self.errors.append(repr(event))
                    self._event("error")
                    return
        except (PeerLost, OSError, ConnectionError, RemoteProtocolError) as exc:
            self.errors.append(repr(exc))
            self._event("error")
        finally:
            self._connected.clear()
            self._progress.set()

    # -- parameter resync (sims.exact_params: the client's mechanism) --------------------------------

    @property
    def resyncs(self) -> int:
        return self.state.resyncs

    @property
    def served(self) -> int:
        return self.state.served

    @property
    def params(self) -> list[np.ndarray]:
        return self.state.params

    def _seen(self, iteration: int, layer: int) -> bool:
        return self.fingerprint(iteration, layer) >= 0

    async def _on_params(self, msg: Any, conn: Connection, transport: Transport) -> None:
        out, swapped = self.state.on_params(msg, self._seen, self.skip_below)
        for frame in out:
            await transport.send(conn.send_parts(frame))
        if swapped:
            self._event("resync")

    async def _maybe_serve(self, conn: Connection, transport: Transport) -> None:
        for frame in self.state.serve(self._seen, self.skip_below):
            await transport.send(conn.send_parts(frame))

    # -- training loop ---------------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def allow_until(self, iteration: int | None) -> None:
        self._allow = iteration
        self._allow_changed.set()

    def _ready(self, n: int) -> bool:
        need = n - 1 - self.staleness
        if need < 0 or need < self.skip_below:
            return True
        return all(self.fingerprint(need, layer) >= 0 for layer in range(self.layers))

    async def wait(self, pred: Callable[[], bool]) -> None:
        while not pred():
            self._progress.clear()
            await self._progress.wait()

    def waiting(self) -> bool:
        """Whether the loop is blocked on the job (not on the harness's allow_until)."""
        n = max(self.next_it, self.skip_below)
        return n < self.iterations and (self._allow is None or n < self._allow)

    async def run(self) -> None:
        while True:
            n = max(self.next_it, self.skip_below)
            if n >= self.iterations:
                return
            while self._allow is not None and n >= self._allow:
                self._allow_changed.clear()
                await self._allow_changed.wait()
            await self.wait(lambda n=n: self._ready(n) or not self._connected.is_set())  # type: ignore[misc]
            if not self._connected.is_set():
                await self._connected.wait()
                continue
            if self.compute_s > 0:
                await asyncio.sleep(self.compute_s)
            for layer in reversed(range(self.layers)):
                p = make_payload(self.site, n, layer)
                flags = self.pushed_flags[layer]
                if n >= len(flags):
                    flags.extend(bytes(n + 1 - len(flags) + 256))
                if not flags[n]:
                    flags[n] = 1
                    p.add_into(self.pushed_sum[layer])
                    self.pushes += 1
                self.unacked[(n, layer)] = p
                # kept as unacknowledged if the link is gone: sent again after reconnecting
                with contextlib.suppress(WanrtError, OSError, ConnectionError, AssertionError):
                    await self._send(Push(self.job, n, layer, 0, self.site, p))
            self.next_it = n + 1

    def complete(self, until: int) -> bool:
        return all(
            self.fingerprint(it, layer) >= 0
            for it in range(self.skip_below, until)
            for layer in range(self.layers)
        )

    def missing(self, until: int) -> set[Key]:
        return {
            (it, layer)
            for it in range(self.skip_below, until)
            for layer in range(self.layers)
            if self.fingerprint(it, layer) < 0
        }

    def fingerprint(self, iteration: int, layer: int) -> int:
        fp = self.fingerprints[layer]
        return int(fp[iteration]) if 0 <= iteration < len(fp) else -1

    def _set_fingerprint(self, key: Key, value: int) -> None:
        it, layer = key
        fp = self.fingerprints[layer]
        if it >= len(fp):
            grown = np.full(it + 1024, -1, np.int64)  # linear steps: a doubled array's -1 tail is RSS too
            grown[: len(fp)] = fp
            self.fingerprints[layer] = fp = grown
        fp[it] = value

    def pushed_iterations(self, layer: int) -> np.ndarray:
        return np.flatnonzero(np.frombuffer(bytes(self.pushed_flags[layer]), np.uint8))

    def parameters(self) -> list[np.ndarray]:
        """The trainer's parameter vector: every aggregate it applied, summed per layer (exact in fp32)."""
        return self.params


def _crc(a: Aggregate) -> int:
    ids = ",".join(a.sites).encode()
    return zlib.crc32(ids + b"|" + a.payload.values_f32().tobytes())
