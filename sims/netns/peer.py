"""A wanrt endpoint to run inside a namespace: ``python -m sims.netns.peer serve|send ...``.

It speaks the real stack: ``transports.listen``/``connect`` by URL (a URL query adds ShapedTransport, which
is how delay reaches the wire when the kernel has no netem), then the authenticated ``wanrt.protocol``
handshake, then Heartbeat pings and Push messages carrying checkable payloads. It reports as JSON lines on
stdout, one object each with an ``event`` key, so the harness waits on readiness (``ready``) instead of
sleeping, and measures goodput where it is defined: at the receiver (``progress`` samples, ``done``).
The job secret comes from the environment (``WANRT_NETNS_SECRET``, hex), not argv, which ``ps`` shows.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import sys
import time
from typing import Any, Final

import numpy as np

from transports import Transport, connect, listen
from wanrt import codec
from wanrt.errors import AuthError, ProtocolError, TransportError, WanrtTimeout
from wanrt.payload import SparsePayload
from wanrt.protocol import (
    NEED_DATA,
    Bye,
    Connection,
    ConnectionClosed,
    Error,
    Event,
    Heartbeat,
    Hello,
    Push,
    Welcome,
)

__all__ = ["SECRET_ENV", "expected_payload", "main"]

SECRET_ENV: Final = "WANRT_NETNS_SECRET"
JOB: Final = "netns-job"
#: Exit status of ``send`` when the handshake fails authentication (the test tells it from a crash).
EXIT_AUTH: Final = 3
BLOCK: Final = 16
RECV_BYTES: Final = 1 << 20
#: Payload bytes per Push: the protocol's default chunk size, a typical mid-size layer.
DEFAULT_MESSAGE_BYTES: Final = 256 * 1024


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "t": time.monotonic(), **fields}), flush=True)


def expected_payload(iteration: int, n_values: int) -> SparsePayload:
    """Message ``iteration``'s payload: every block of a dense fp32 vector that depends on the iteration,
    so the receiver can check each value and a reordered or corrupted message cannot pass."""
    dense = (np.arange(n_values, dtype=np.float32) * np.float32(0.5)) + np.float32(iteration)
    nb = -(-n_values // BLOCK)
    return SparsePayload.from_dense_blocks(0, dense, np.arange(nb, dtype=np.int64), BLOCK)


class Meter:
    """Counts the bytes a transport receives, from the first one, and reports them every ``every`` s."""

    def __init__(self, t: Transport, every: float) -> None:
        self.t, self.every = t, every
        self.bytes = 0
        self.first_t: float | None = None
        self.last_t: float | None = None
        self._reported = -math.inf

    async def recv(self, max_bytes: int) -> bytes:
        data = await self.t.recv(max_bytes)
        now = time.monotonic()
        if data:
            self.first_t = now if self.first_t is None else self.first_t
            self.last_t = now
            self.bytes += len(data)
            if now - self._reported >= self.every:
                emit("progress", bytes=self.bytes)
                self._reported = now
        return data


def warm_up(n_values: int) -> None:
    """Run the payload codec once before measuring: its first call imports numba and JIT-compiles (most
    of a second), which would otherwise stall the receiver mid-transfer and show up as lost goodput."""
    p = expected_payload(0, n_values)
    meta, buffers = codec.encode_payload(p)
    codec.decode_payload(meta, buffers)


async def next_event(conn: Connection, t: Transport | Meter) -> Event:
    """The next protocol event, reading from ``t`` as needed (EOF is fed as b"")."""
    while (ev := conn.next_event()) is NEED_DATA:
        conn.receive_data(await t.recv(RECV_BYTES))
    return ev


def _secret() -> bytes:
    try:
        return bytes.fromhex(os.environ[SECRET_ENV])
    except (KeyError, ValueError):
        sys.exit(f"set {SECRET_ENV} to the job secret in hex")


async def _abort(conn: Connection, t: Transport, exc: BaseException) -> None:
    # The peer may be gone already; closing below is then all that is left to do.
    with contextlib.suppress(TransportError, ProtocolError):
        await t.send([conn.abort(exc)])
    await t.close()


async def _session(conn: Connection, t: Transport, meter: Meter) -> dict[str, Any]:
    """Server side after the handshake: echo pings, check pushes, answer Bye with Bye, report the count."""
    pushes = 0
    while True:
        ev = await next_event(conn, meter)
        if isinstance(ev, Heartbeat):
            await t.send([conn.send(Heartbeat(ev.seq, ev.sent_at))])
        elif isinstance(ev, Push):
            want = expected_payload(ev.iteration, ev.payload.dense_len)
            if not np.array_equal(ev.payload.values, want.values):
                raise AssertionError(f"push {ev.iteration}: payload differs from what was sent")
            pushes += 1
        elif isinstance(ev, Bye):
            await t.send([conn.send(Bye("done"))])
        elif isinstance(ev, ConnectionClosed):
            return {
                "bytes": meter.bytes,
                "pushes": pushes,
                "first_t": meter.first_t,
                "last_t": meter.last_t,
                "clean": ev.clean,
            }


async def serve(args: argparse.Namespace) -> int:
    secret = _secret()
    finished: asyncio.Queue[bool] = asyncio.Queue()  # one per connection: did it end without a fault of ours

    async def handler(t: Transport) -> None:
        conn = Connection("gateway", args.site, JOB, secret, side="server", peer=t.peer)
        meter = Meter(t, args.report_every)
        ok = False
        try:
            ev = await next_event(conn, meter)
            if not isinstance(ev, Hello):
                raise AssertionError(f"expected Hello, got {ev!r}")
            await t.send([conn.accept()])
            ev = await next_event(conn, meter)
            if not conn.authenticated:
                code = ev.code if isinstance(ev, Error) else None
                emit("handshake", ok=False, error=type(ev).__name__, peer_error_code=code)
                await t.close()
                ok = True  # a refused client is the server working as intended
                return
            emit("handshake", ok=True, peer_site=conn.peer_site, version=conn.version)
            emit("done", **await _session(conn, t, meter))
            await t.close()
            ok = True
        except (AuthError, ProtocolError, TransportError, WanrtTimeout) as exc:
            emit(
                "handshake" if not conn.authenticated else "failed",
                ok=False,
                error=type(exc).__name__,
                message=str(exc),
            )
            await _abort(conn, t, exc)
        except Exception as exc:
            emit("failed", ok=False, error=type(exc).__name__, message=str(exc))
            raise  # the listener logs the traceback and closes this connection
        finally:
            finished.put_nowait(ok)

    warm_up(DEFAULT_MESSAGE_BYTES // 4)
    listener = await listen(args.url, handler)
    emit("ready", url=listener.url)
    results = [await finished.get() for _ in range(args.connections)]
    await listener.aclose()
    return 0 if all(results) else 1


async def send(args: argparse.Namespace) -> int:
    n_values = max(BLOCK, args.message_bytes // 4)
    warm_up(n_values)
    url = args.url
    if url == "-":
        # Started before the server knew its port: warm up in parallel with it, then wait to be told.
        emit("waiting")
        url = (await asyncio.to_thread(sys.stdin.readline)).strip()
    t = await connect(url)
    conn = Connection("trainer", args.site, JOB, _secret(), side="client", peer=url)
    try:
        await t.send([conn.hello()])
        # The Welcome's proof is checked inside next_event: AuthError on a wrong secret.
        if not isinstance(ev := await next_event(conn, t), Welcome):
            raise AssertionError(f"expected Welcome, got {ev!r}")
        await t.send([conn.authenticate()])
    except AuthError as exc:
        emit("handshake", ok=False, error=type(exc).__name__, message=str(exc))
        await _abort(conn, t, exc)
        return EXIT_AUTH
    emit("handshake", ok=True, peer_site=conn.peer_site, version=conn.version)
    rtts = []
    for seq in range(args.pings):
        sent = time.monotonic()
        await t.send([conn.send(Heartbeat(seq, sent))])
        ev = await next_event(conn, t)
        if not (isinstance(ev, Heartbeat) and ev.seq == seq):
            raise AssertionError(f"ping {seq}: got {ev!r}")
        rtts.append(time.monotonic() - sent)
    n_msgs = -(-args.bytes // (n_values * 4)) if args.bytes > 0 else 0
    for i in range(n_msgs):
        push = Push(JOB, i, 0, 0, args.site, expected_payload(i, n_values))
        await t.send(conn.send_parts(push))
    await t.send([conn.send(Bye("done"))])
    ev = await next_event(conn, t)
    closed = await next_event(conn, t)
    await t.close()
    emit(
        "done", rtts=rtts, pushes=n_msgs, bye=isinstance(ev, Bye), closed=isinstance(closed, ConnectionClosed)
    )
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sims.netns.peer", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="accept N connections, check and count what arrives")
    s.add_argument("--url", required=True, help="listen URL, e.g. tcp://10.213.0.2:0?delay=0.02&rate=inf")
    s.add_argument("--connections", type=int, default=1)
    s.add_argument("--report-every", type=float, default=0.1, help="seconds between progress lines")
    s.add_argument("--site", default="site-server")
    c = sub.add_parser("send", help="handshake, ping, push BYTES of payload, say Bye")
    c.add_argument("--url", required=True, help="server URL, or - to read it from stdin once warmed up")
    c.add_argument("--bytes", type=int, default=0, help="payload bytes to push (rounded up to messages)")
    c.add_argument("--message-bytes", type=int, default=DEFAULT_MESSAGE_BYTES)
    c.add_argument("--pings", type=int, default=0)
    c.add_argument("--site", default="site-client")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return asyncio.run(serve(args) if args.cmd == "serve" else send(args))


if __name__ == "__main__":
    sys.exit(main())
