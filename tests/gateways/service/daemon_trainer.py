"""A site leader for the daemon tests: speaks the real protocol as role ``trainer`` over a real transport.

Pushes one payload per layer and iteration (last layer first, like a backward pass), at most ``staleness``
iterations ahead of the aggregates it has received, acknowledges every Aggregate, and keeps each push until
the gateway acknowledges it, so that after its gateway was restarted it can send the unacknowledged ones
again (:meth:`FakeTrainer.reconnect`). Everything it pushed and received is recorded for the checks.
Its parameters (the sum of every result it applied) and their resync are the soak trainer's
(:class:`sims.exact_params.ExactParams`: the client's resync mechanism).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from sims.exact_params import ExactParams
from tests.gateways.harness import make_payload
from transports import Transport, connect
from wanrt.errors import PeerLost, RemoteProtocolError
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
PayloadFn = Callable[[str, int, int], SparsePayload]


def signature_info(layers: int, variant: str = "") -> dict[str, Any]:
    """A model signature (wanrt.client.link.signature) for ``layers`` linear layers."""
    from wanrt.client.link.signature import LayerSignature

    names = [f"layer{i}{variant}.weight" for i in range(layers)]
    return LayerSignature.of(names, [(8, 8)] * layers, ["float32"] * layers).info()


class FakeTrainer:
    def __init__(
        self,
        url: str,
        site: str,
        job: str,
        secret: bytes,
        *,
        layers: int,
        iterations: int,
        staleness: int = 1,
        payload: PayloadFn = make_payload,
        info: dict[str, Any] | None = None,
    ) -> None:
        self.url, self.site, self.job, self.secret = url, site, job, secret
        self.layers, self.iterations, self.staleness = layers, iterations, staleness
        self.payload = payload
        self.info = info if info is not None else signature_info(layers)
        self.pushed: dict[Key, SparsePayload] = {}
        self.unacked: dict[Key, SparsePayload] = {}
        self.aggregates: dict[Key, Aggregate] = {}
        self.duplicates = 0
        self.configs: list[ConfigUpdate] = []
        self.notices: list[Notice] = []
        self.welcome: Welcome | None = None
        self.skip_below = 0  # iterations below never get aggregates (the gateway joined later)
        self.next_it = 0
        self.errors: list[str] = []
        self.state = ExactParams(layers, peer=url)
        self._conn: Connection | None = None
        self._transport: Transport | None = None
        self._reader: asyncio.Task[None] | None = None
        self._progress = asyncio.Event()
        self._connected = asyncio.Event()
        self._allow: int | None = None  # push only iterations below this (None: no limit)
        self._allow_changed = asyncio.Event()

    # -- connection ------------------------------------------------------------------------------------

    async def connect(self, *, resend: bool = False) -> Welcome:
        transport = await connect(self.url)
        conn = Connection("trainer", self.site, self.job, self.secret, side="client", peer=self.url)
        await transport.send([conn.hello(self.info)])
        event = await self._next(conn, transport)
        if not isinstance(event, Welcome):
            await transport.close()
            raise RemoteProtocolError(f"no Welcome: {event!r}")
        await transport.send([conn.authenticate()])
        self._conn, self._transport, self.welcome = conn, transport, event
        for frame in self.state.connected():  # a snapshot still owed is asked for again
            await transport.send(conn.send_parts(frame))
        join_at = event.info.get("join_at", -1)
        if isinstance(join_at, int) and join_at > 0:
            self.skip_below = max(self.skip_below, join_at)
        self._reader = asyncio.get_running_loop().create_task(self._read(conn, transport))
        if resend:  # before the training loop may push anything newer
            for key in sorted(self.unacked):
                await self._send(Push(self.job, key[0], key[1], 0, self.site, self.unacked[key]))
        self._connected.set()
        return event

    async def reconnect(self) -> Welcome:
        """After the gateway came back: connect, send every unacknowledged push again, carry on."""
        return await self.connect(resend=True)

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
                    if key in self.aggregates:
                        self.duplicates += 1
                        _check_same(self.aggregates[key], event)
                    else:
                        self.aggregates[key] = event
                        if 0 <= event.layer < self.layers:
                            self.state.take(key, event.payload)
                    await transport.send(conn.send_parts(Ack(event.iteration, event.layer, event.round)))
                    self._progress.set()
                    for frame in self.state.serve(self._seen, self.skip_below):
                        await transport.send(conn.send_parts(frame))
                elif isinstance(event, (ParamAnnounce, ParamChunk, ParamRefuse, ParamRequest)):
                    out, _ = self.state.on_params(event, self._seen, self.skip_below)
                    for frame in out:
                        await transport.send(conn.send_parts(frame))
                    self._progress.set()
                elif isinstance(event, Ack):
                    self.unacked.pop((event.iteration, event.layer), None)
                    self._progress.set()
                elif isinstance(event, ConfigUpdate):
                    self.configs.append(event)
                    self._progress.set()
                elif isinstance(event, Notice):
                    self.notices.append(event)
                    for frame in self.state.on_notice(event):
                        await transport.send(conn.send_parts(frame))
                    self._progress.set()
                elif isinstance(event, Heartbeat):
                    continue
                elif isinstance(event, (Bye, Error, ConnectionClosed)):
                    self.errors.append(repr(event))
                    return
        except (PeerLost, OSError, ConnectionError) as exc:
            self.errors.append(repr(exc))
        finally:
            self._connected.clear()
            self._progress.set()

    def _seen(self, iteration: int, layer: int) -> bool:
        return (iteration, layer) in self.aggregates

    # -- training loop ---------------------------------------------------------------------------------

    def allow_until(self, iteration: int | None) -> None:
        """Push only iterations below ``iteration`` until told otherwise (to stop a run mid-way)."""
        self._allow = iteration
        self._allow_changed.set()

    def _ready(self, n: int) -> bool:
        need = n - 1 - self.staleness
        if need < 0 or need < self.skip_below:
            return True
        return all((need, layer) in self.aggregates for layer in range(self.layers))

    async def wait(self, pred: Callable[[], bool]) -> None:
        while not pred():
            self._progress.clear()
            await self._progress.wait()

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
            for layer in reversed(range(self.layers)):
                p = self.payload(self.site, n, layer)
                self.pushed[(n, layer)] = p
                self.unacked[(n, layer)] = p
                # kept as unacknowledged if this fails: sent again after reconnecting
                with contextlib.suppress(PeerLost, OSError, ConnectionError):
                    await self._send(Push(self.job, n, layer, 0, self.site, p))
            self.next_it = n + 1

    async def wait_all(self, until: int) -> None:
        """Until aggregates of every layer of every iteration in [skip_below, until) arrived."""
        await self.wait(
            lambda: all(
                (it, layer) in self.aggregates
                for it in range(self.skip_below, until)
                for layer in range(self.layers)
            )
        )


def _check_same(a: Aggregate, b: Aggregate) -> None:
    assert a.sites == b.sites and bytes(a.payload.values_f32()) == bytes(b.payload.values_f32()), (
        f"two different aggregates for {(a.iteration, a.layer)}"
    )
