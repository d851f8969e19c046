"""A site leader that speaks the real trainer protocol over a real transport, without torch.

The daemon tests (tools/harness/daemon_trainer.py) and the chaos soak (tools/chaos_trainer.py)
both need a trainer that pushes one payload per layer and iteration (last layer first, like a backward
pass), at most ``staleness`` iterations ahead of the aggregates it has received, acknowledges every
Aggregate, keeps each push until the gateway acknowledges it (so :meth:`ProtocolTrainer.reconnect` can send
the unacknowledged ones again after a gateway restart), and runs the client's parameter resync
(:class:`tools.harness.exact_params.ExactParams`). They differ only in what they *record*: the tests keep
every
payload and aggregate to compare them; the soak keeps a fingerprint per aggregate and a flag per push,
because its memory metric must measure the daemons, not this record. So the protocol lives here once and
the records are hooks (:meth:`_record_push`, :meth:`_record_aggregate`, :meth:`has_aggregate`,
:meth:`_event`). It lives outside tests/ because tools/ must not import tests.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from tools.harness.exact_params import ExactParams
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

__all__ = ["Key", "ProtocolTrainer", "signature_info"]

Key = tuple[int, int]
_Errors = tuple[type[BaseException], ...]


def signature_info(layers: int, variant: str = "") -> dict[str, Any]:
    """A model signature (wanrt.client.link.signature) for ``layers`` linear layers."""
    from wanrt.client.link.signature import LayerSignature

    names = [f"layer{i}{variant}.weight" for i in range(layers)]
    return LayerSignature.of(names, [(8, 8)] * layers, ["float32"] * layers).info()


class ProtocolTrainer:
    """The protocol and the training loop; subclasses say what is recorded (see the module docstring)."""

    #: errors that end the reader quietly (recorded in ``errors``); anything else fails the reader task
    READ_ERRORS: ClassVar[_Errors] = (PeerLost, OSError, ConnectionError)
    #: errors of a push that leave it unacknowledged, to be sent again after reconnecting
    PUSH_ERRORS: ClassVar[_Errors] = (PeerLost, OSError, ConnectionError)
    #: errors of the resend in :meth:`reconnect` that leave the pushes for the next reconnect
    RESEND_ERRORS: ClassVar[_Errors] = ()

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
        compute_s: float = 0.0,
        info: dict[str, Any] | None = None,
    ) -> None:
        self.url, self.site, self.job, self.secret = url, site, job, secret
        self.layers, self.iterations, self.staleness = layers, iterations, staleness
        self.compute_s = compute_s  # a pause per iteration, so a run lasts as long as a schedule wants
        self.info = info if info is not None else signature_info(layers)
        self.unacked: dict[Key, SparsePayload] = {}
        self.duplicates = 0
        self.configs: list[ConfigUpdate] = []
        self.notices: list[Notice] = []
        self.welcome: Welcome | None = None
        self.errors: list[str] = []
        self.skip_below = 0  # iterations below never get aggregates (the gateway joined later)
        self.next_it = 0
        # the parameters (every result applied, summed) and the resync state
        self.state = ExactParams(layers, peer=url)
        self._conn: Connection | None = None
        self._transport: Transport | None = None
        self._reader: asyncio.Task[None] | None = None
        self._progress = asyncio.Event()
        self._connected = asyncio.Event()
        self._allow: int | None = None  # push only iterations below this (None: no limit)
        self._allow_changed = asyncio.Event()

    # -- what a subclass records ---------------------------------------------------------------------

    def has_aggregate(self, iteration: int, layer: int) -> bool:
        raise NotImplementedError

    def _record_aggregate(self, key: Key, event: Aggregate) -> bool:
        """Record an Aggregate; True if it is the first for ``key`` (its payload is then applied)."""
        raise NotImplementedError

    def _payload(self, iteration: int, layer: int) -> SparsePayload:
        raise NotImplementedError

    def _record_push(self, key: Key, payload: SparsePayload) -> None:
        """A push about to be sent (the same key again after a reconnect is not recorded twice here)."""

    def _event(self, kind: str) -> None:
        """The trainer heard something (``kind``: welcome, aggregate, config, notice, resync, error)."""
        self._progress.set()

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
        self._event("welcome")
        self._reader = asyncio.get_running_loop().create_task(self._read(conn, transport))
        if resend:  # before the training loop may push anything newer
            with contextlib.suppress(*self.RESEND_ERRORS):
                for key in sorted(self.unacked):
                    await self._send(Push(self.job, key[0], key[1], 0, self.site, self.unacked[key]))
        self._connected.set()
        return event

    async def reconnect(self) -> Welcome:
        """After the gateway came back: connect, send every unacknowledged push again, carry on."""
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

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

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
                    if self._record_aggregate(key, event) and 0 <= event.layer < self.layers:
                        self.state.take(key, event.payload)
                    await transport.send(conn.send_parts(Ack(event.iteration, event.layer, event.round)))
                    self._event("aggregate")
                    for frame in self.state.serve(self.has_aggregate, self.skip_below):
                        await transport.send(conn.send_parts(frame))
                elif isinstance(event, (ParamAnnounce, ParamChunk, ParamRefuse, ParamRequest)):
                    out, swapped = self.state.on_params(event, self.has_aggregate, self.skip_below)
                    for frame in out:
                        await transport.send(conn.send_parts(frame))
                    if swapped:
                        self._event("resync")
                    self._progress.set()
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
        except self.READ_ERRORS as exc:
            self.errors.append(repr(exc))
            self._event("error")
        finally:
            self._connected.clear()
            self._progress.set()

    # -- parameter resync (tools.harness.exact_params: the client's mechanism) -------------------------

    @property
    def resyncs(self) -> int:
        return self.state.resyncs

    @property
    def served(self) -> int:
        return self.state.served

    @property
    def params(self) -> list[np.ndarray]:
        return self.state.params

    # -- training loop ---------------------------------------------------------------------------------

    def allow_until(self, iteration: int | None) -> None:
        """Push only iterations below ``iteration`` until told otherwise (to stop a run mid-way)."""
        self._allow = iteration
        self._allow_changed.set()

    def _ready(self, n: int) -> bool:
        need = n - 1 - self.staleness
        if need < 0 or need < self.skip_below:
            return True
        return all(self.has_aggregate(need, layer) for layer in range(self.layers))

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
                p = self._payload(n, layer)
                self._record_push((n, layer), p)
                self.unacked[(n, layer)] = p
                # kept as unacknowledged if this fails: sent again after reconnecting
                with contextlib.suppress(*self.PUSH_ERRORS):
                    await self._send(Push(self.job, n, layer, 0, self.site, p))
            self.next_it = n + 1

    def complete(self, until: int) -> bool:
        """Aggregates of every layer of every iteration in [skip_below, until) arrived."""
        return all(
            self.has_aggregate(it, layer)
            for it in range(self.skip_below, until)
            for layer in range(self.layers)
        )

    def missing(self, until: int) -> set[Key]:
        return {
            (it, layer)
            for it in range(self.skip_below, until)
            for layer in range(self.layers)
            if not self.has_aggregate(it, layer)
        }

    async def wait_all(self, until: int) -> None:
        """Until aggregates of every layer of every iteration in [skip_below, until) arrived."""
        await self.wait(lambda: self.complete(until))
