"""A small stand-in for the site gateways, speaking the real protocol: lets the client be tested end to end
before the gateway daemon exists.

One process plays every site's gateway: trainers of ``sites`` connect (role trainer, HMAC handshake with the
job secret), push one payload per (iteration, layer), and once every site has pushed a (iteration, layer),
each gets ``Aggregate`` = the exact fp32 sum over sites (union of the selected blocks). The first trainer's
model signature becomes the job's model and is returned in every Welcome, so a trainer with another model
refuses to train (the client names the first differing layer).

``run_in_thread()`` starts it on its own event loop in a daemon thread for synchronous tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import traceback
from collections.abc import Iterator
from typing import Any

import numpy as np

from transports import Listener, Transport, listen
from wanrt.codec.negotiation import VALUE_CODINGS_KEY, offered_codings
from wanrt.errors import AuthError, RemoteProtocolError, WanrtError
from wanrt.payload import SparsePayload
from wanrt.protocol.connection import Connection
from wanrt.protocol.events import NEED_DATA, ConnectionClosed
from wanrt.protocol.messages import Aggregate, Auth, Bye, ConfigUpdate, ErrorCode, Hello, Message, Push


def exact_sum(parts: list[SparsePayload]) -> SparsePayload:
    """Sum of payloads of one layer in fp32, over the union of their blocks, in a fixed (site) order.

    Summed over the union's blocks only, not through a dense vector: the same fp32 additions in the same
    order from +0.0 (so the same bits), but without a layer-sized array per push — with a 10 M-element layer
    the dense sum took this stand-in longer than a training step, and tools/profile_client_step.py counted
    that as the trainer's wait."""
    first = parts[0]
    bs = first.block_size
    blocks = np.unique(np.concatenate([p.indices for p in parts]))
    vals = np.zeros((blocks.shape[0], bs), dtype=np.float32)
    for p in parts:
        if p.nnz_blocks:
            vals[np.searchsorted(blocks, p.indices)] += p.values_f32().reshape(-1, bs)
    full, tail = divmod(first.dense_len, bs)
    if tail and blocks.shape[0] and int(blocks[-1]) == full:
        vals[-1, tail:] = 0.0  # the padding of a tail block stays zero, as from_dense_blocks leaves it
    return SparsePayload(first.layer, first.dense_len, bs, blocks.astype(np.int64), vals.reshape(-1), "fp32")


class FakeGateway:
    def __init__(self, url: str, *, sites: tuple[str, ...], job: str, secret: bytes) -> None:
        self.url = url
        self.sites = sites
        self.job = job
        self.secret = secret
        self.model_info: dict[str, Any] | None = None
        self.model_site: str | None = None
        #: the low-bit codings the Welcome offers, as a real gateway's does (None: an older gateway's none)
        self.value_codings: str | None = offered_codings()
        #: more Welcome ``info`` entries (a test gives what a real gateway would, e.g. its push cut)
        self.welcome_info: dict[str, Any] = {}
        self.errors: list[str] = []
        self.pushes = 0
        self.elements = 0  # value slots received, to check what compression saved
        self._conns: dict[str, tuple[Connection, Transport]] = {}
        self._pending: dict[tuple[int, int], dict[str, SparsePayload]] = {}
        self._listener: Listener | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._joined: asyncio.Condition | None = None

    def _condition(self) -> asyncio.Condition:
        if self._joined is None:
            self._joined = asyncio.Condition()
        return self._joined

    async def wait_for_sites(self, *sites: str) -> None:
        """Return once every named site has finished its handshake here (the client's side of the handshake
        ends when it *sends* Auth, before this gateway has read it)."""
        cond = self._condition()
        async with cond:
            await cond.wait_for(lambda: all(s in self._conns for s in sites))

    async def start(self) -> None:
        self._listener = await listen(self.url, self._handle)

    async def stop(self) -> None:
        if self._listener is not None:
            self._listener.close()
            await self._listener.wait_closed()

    async def announce(self, values: dict[str, int | float | str | bool], effective_iteration: int) -> None:
        for conn, transport in list(self._conns.values()):
            await transport.send(conn.send_parts(ConfigUpdate(values, effective_iteration)))

    async def _next(self, conn: Connection, transport: Transport) -> Message | ConnectionClosed:
        while True:
            event = conn.next_event()
            if event is not NEED_DATA:
                return event
            conn.receive_data(await transport.recv())

    async def _handle(self, transport: Transport) -> None:
        conn = Connection("gateway", "fakegw", self.job, self.secret, side="server", peer=transport.peer)
        site = None
        try:
            hello = await self._next(conn, transport)
            if not isinstance(hello, Hello):
                return
            if hello.site not in self.sites or hello.site in self._conns:
                await transport.send(
                    [conn.reject(ErrorCode.PROTOCOL, f"unknown or duplicate site {hello.site}")]
                )
                return
            if self.model_info is None and "model" in hello.info:
                self.model_info = {k: hello.info[k] for k in ("model", "n_layers", "group", "layers")}
                self.model_site = hello.site
            info = dict(self.model_info or {}, model_site=self.model_site or "")
            if self.value_codings is not None:
                info[VALUE_CODINGS_KEY] = self.value_codings
            info.update(self.welcome_info)
            await transport.send([conn.accept(info=info)])
            auth = await self._next(conn, transport)
            if not isinstance(auth, Auth):
                return
            if self.model_info is not None and hello.info.get("model") != self.model_info["model"]:
                self.errors.append(f"site {hello.site} has another model; it should have aborted")
                return
            site = hello.site
            self._conns[site] = (conn, transport)
            async with self._condition():
                self._condition().notify_all()
            while True:
                msg = await self._next(conn, transport)
                if isinstance(msg, Push):
                    await self._on_push(site, msg)
                elif isinstance(msg, Bye):
                    await transport.send([conn.send(Bye("bye"))])
                    return
                elif isinstance(msg, ConnectionClosed):
                    return
        except (AuthError, RemoteProtocolError) as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")
            with contextlib.suppress(WanrtError, OSError):
                await transport.send([conn.abort(exc)])
        except Exception:
            self.errors.append(traceback.format_exc())  # the test shows what broke the fake itself
            raise
        finally:
            if site is not None:
                self._conns.pop(site, None)

    async def _on_push(self, site: str, msg: Push) -> None:
        self.pushes += 1
        self.elements += msg.payload.nnz
        key = (msg.iteration, msg.layer)
        got = self._pending.setdefault(key, {})
        if site in got:
            raise RemoteProtocolError(f"site {site} pushed iteration {key[0]} layer {key[1]} twice")
        got[site] = msg.payload
        if len(got) < len(self.sites):
            return
        del self._pending[key]
        total = exact_sum([got[s] for s in self.sites])
        agg = Aggregate(self.job, msg.iteration, msg.layer, 0, "fakegw", total, self.sites)
        for s in self.sites:
            if s in self._conns:
                conn, transport = self._conns[s]
                await transport.send(conn.send_parts(agg))


@contextlib.contextmanager
def run_in_thread(gw: FakeGateway) -> Iterator[asyncio.AbstractEventLoop]:
    """Serve ``gw`` on its own loop in a daemon thread for the duration of the ``with`` block."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="fake-gateway", daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(gw.start(), loop).result(10)
    try:
        yield loop
    finally:
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(gw.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def main() -> None:
    """``python -m tools.harness.fake_gateway --url unix:///tmp/wanrt.sock --sites a,b --job j
    --secret-file job.key``: serve until interrupted (for trying docs/client.md's example locally)."""
    import argparse

    from wanrt.client.bootstrap import read_secret

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--url", required=True)
    ap.add_argument("--sites", required=True, help="comma-separated site names")
    ap.add_argument("--job", required=True)
    ap.add_argument("--secret-file", required=True)
    args = ap.parse_args()
    gw = FakeGateway(
        args.url, sites=tuple(args.sites.split(",")), job=args.job, secret=read_secret(args.secret_file)
    )

    async def serve() -> None:
        await gw.start()
        print(f"fake gateway for sites {gw.sites} listening on {gw.url}", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await gw.stop()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


if __name__ == "__main__":
    main()
