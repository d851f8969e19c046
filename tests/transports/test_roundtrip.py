"""Round trips over every transport kind: bytes intact, EOF, close semantics, big transfers."""

from __future__ import annotations

import asyncio
import hashlib

import numpy as np
import pytest

from tests.transports.conftest import ListenFactory, echo, read_all, read_exactly
from transports import Transport, connect
from wanrt.errors import LocalProtocolError, TransportError


async def test_echo_round_trip(serve: ListenFactory, kind: str) -> None:
    lst = await serve(echo)
    t = await connect(lst.url)
    assert t.peer.startswith(kind + "://")
    await t.send([b"hello ", memoryview(b"wan"), b"rt"])
    assert await read_exactly(t, 11) == b"hello wanrt"
    # non-byte memoryviews (a float32 buffer, as the codec produces) go out as their raw bytes
    arr = np.arange(5, dtype=np.float32)
    await t.send([memoryview(arr.data)])
    assert await read_exactly(t, arr.nbytes) == arr.tobytes()
    with pytest.raises(LocalProtocolError):
        await t.recv(0)
    await t.close()
    assert t.closed
    await t.close()  # idempotent


async def test_large_transfer_intact_and_eof(serve: ListenFactory) -> None:
    """20 MB in mixed part sizes arrives byte-exact; the receiver then sees EOF as b""."""
    rng = np.random.default_rng(1)
    blob = rng.integers(0, 256, size=20_000_000, dtype=np.uint8).tobytes()
    got: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def sink(t: Transport) -> None:
        got.set_result(await read_all(t))

    lst = await serve(sink)
    t = await connect(lst.url)
    view = memoryview(blob)
    off, step = 0, 1
    while off < len(view):
        n = min(step, len(view) - off)
        await t.send([view[off : off + n // 2], view[off + n // 2 : off + n]])
        off += n
        step = min(step * 3 + 7, 3_000_000)
    await t.close()
    data = await asyncio.wait_for(got, 60)
    assert len(data) == len(blob)
    assert hashlib.sha256(data).digest() == hashlib.sha256(blob).digest()


async def test_server_close_gives_client_eof(serve: ListenFactory) -> None:
    async def hello_and_close(t: Transport) -> None:
        await t.send([b"bye"])
        # returning closes the connection gracefully

    lst = await serve(hello_and_close)
    t = await connect(lst.url)
    assert await read_all(t) == b"bye"
    await t.close()


async def test_send_and_recv_after_close_raise(serve: ListenFactory) -> None:
    lst = await serve(echo)
    t = await connect(lst.url)
    await t.close()
    with pytest.raises(TransportError):
        await t.send([b"x"])
    with pytest.raises(TransportError):
        await t.recv()


async def test_many_concurrent_clients(serve: ListenFactory) -> None:
    lst = await serve(echo)

    async def one(i: int) -> bytes:
        t = await connect(lst.url)
        msg = f"client {i} ".encode() * 100
        await t.send([msg])
        got = await read_exactly(t, len(msg))
        await t.close()
        return got

    results = await asyncio.gather(*(one(i) for i in range(12)))
    assert results == [f"client {i} ".encode() * 100 for i in range(12)]
