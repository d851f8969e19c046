"""Failure paths: refused connects, resets, peers that vanish, handlers that raise, deadlines."""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path
from typing import Any

import pytest

from tests.transports.conftest import ListenFactory, echo, read_all, read_exactly
from transports import Timeouts, Transport, connect, listen, memory_pair
from transports.stream import WRITE_HIGH_WATER, StreamTransport
from wanrt.errors import PeerLost, TransportError, WanrtTimeout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_connect_refused_names_the_url(tmp_path: Path) -> None:
    port = _free_port()
    for url in (f"tcp://127.0.0.1:{port}", f"unix://{tmp_path}/nobody.sock", "mem://nobody"):
        with pytest.raises(TransportError) as info:
            await connect(url)
        assert url in str(info.value)


async def test_handler_exception_closes_only_that_connection(
    serve: ListenFactory, caplog: pytest.LogCaptureFixture
) -> None:
    calls = 0

    async def flaky(t: Transport) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("boom")
        await echo(t)

    lst = await serve(flaky)
    with caplog.at_level(logging.ERROR, logger="transports.base"):
        t1 = await connect(lst.url)
        assert await read_all(t1) == b""  # closed by the listener after the handler raised
        await t1.close()
    assert any("handler failed" in r.getMessage() for r in caplog.records)
    t2 = await connect(lst.url)
    await t2.send([b"still serving"])
    assert await read_exactly(t2, 13) == b"still serving"
    await t2.close()
    assert calls == 2


async def test_listener_close_stops_accepting_and_cancels_stuck_handlers(kind: str, tmp_path: Path) -> None:
    from tests.transports.conftest import url_for

    cancelled = asyncio.Event()
    started = asyncio.Event()

    async def stuck(t: Transport) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    lst = await listen(url_for(kind, tmp_path), stuck, timeouts=Timeouts(close=0.05))
    t = await connect(lst.url)
    await started.wait()
    assert lst.connections == 1
    lst.close()
    with pytest.raises(TransportError):
        await connect(lst.url)
    await lst.wait_closed()
    assert cancelled.is_set()
    assert lst.connections == 0
    assert await read_all(t) == b""  # the cancelled handler's connection was closed
    await t.close()
    if kind == "unix":
        assert not Path(str(lst.address)).exists()


async def test_tcp_port_zero_reports_real_port() -> None:
    async def nothing(t: Transport) -> None:
        return None

    async with await listen("tcp://127.0.0.1:0", nothing) as lst:
        assert isinstance(lst.address, tuple)
        host, port = lst.address[0], lst.address[1]
        assert host == "127.0.0.1" and port > 0
        assert lst.url == f"tcp://127.0.0.1:{port}"
        with pytest.raises(TransportError, match="cannot listen"):
            await listen(lst.url, nothing)


async def test_mem_name_in_use() -> None:
    async def nothing(t: Transport) -> None:
        return None

    async with await listen("mem://dup", nothing):
        with pytest.raises(TransportError, match="already listening"):
            await listen("mem://dup", nothing)
    async with await listen("mem://dup", nothing):  # the name is free again after close
        pass


@pytest.mark.parametrize("kind", ["tcp", "mem"])
async def test_reset_raises_peer_lost(kind: str, tmp_path: Path) -> None:
    from tests.transports.conftest import url_for

    async def resetter(t: Transport) -> None:
        await t.recv()
        abort: Any = getattr(t, "abort")  # noqa: B009 - both kinds implement abort()
        abort()

    async with await listen(url_for(kind, tmp_path), resetter) as lst:
        t = await connect(lst.url)
        await t.send([b"go"])
        with pytest.raises(PeerLost):
            await read_all(t)
        await t.close()


async def test_send_to_a_closed_peer_eventually_raises(serve: ListenFactory) -> None:
    async def close_at_once(t: Transport) -> None:
        return None

    lst = await serve(close_at_once)
    t = await connect(lst.url)
    assert await t.recv() == b""  # peer closed
    with pytest.raises(TransportError):
        for _ in range(1000):  # TCP accepts the first writes; the reset shows up on a later one
            await t.send([b"x" * 65536])
    await t.close()


async def test_recv_idle_timeout() -> None:
    a, b = memory_pair(timeouts=Timeouts(recv_idle=0.05))
    with pytest.raises(WanrtTimeout) as info:
        await a.recv()
    assert info.value.fields["phase"] == "recv_idle"
    await b.send([b"late"])  # the transport survives an idle timeout
    assert await a.recv() == b"late"


async def test_send_timeout_aborts_the_stalled_connection() -> None:
    a, b = memory_pair(capacity=1024, timeouts=Timeouts(send=0.05))
    with pytest.raises(WanrtTimeout) as info:
        await a.send([b"x" * 4096])  # b never reads
    assert info.value.fields["phase"] == "send"
    assert a.closed
    with pytest.raises(PeerLost):
        await b.recv()


async def test_tcp_connect_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    async def never(*args: object, **kwargs: object) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(asyncio, "open_connection", never)
    with pytest.raises(WanrtTimeout) as info:
        await connect("tcp://127.0.0.1:9", timeouts=Timeouts(connect=0.05))
    assert info.value.fields["phase"] == "connect"


async def test_tls_handshake_timeout_against_a_silent_server(tls_files: dict[str, str]) -> None:
    from transports import TLSConfig

    async def silent(t: Transport) -> None:
        while await t.recv():  # swallow the ClientHello, never answer
            pass

    async with await listen("tcp://127.0.0.1:0", silent) as lst:
        with pytest.raises(WanrtTimeout) as info:
            await connect(lst.url, tls=TLSConfig(cafile=tls_files["ca"]), timeouts=Timeouts(handshake=0.1))
        assert info.value.fields["phase"] == "handshake"


async def test_tcp_back_pressure_bounds_sender_buffering() -> None:
    """A reader that does not read stops the sender; unblocked, everything arrives."""
    release, done = asyncio.Event(), asyncio.Event()
    received = 0

    async def slow_reader(t: Transport) -> None:
        nonlocal received
        await release.wait()
        while data := await t.recv():
            received += len(data)
        done.set()

    total, msg = 48 << 20, b"z" * (64 << 10)
    sent = 0
    async with await listen("tcp://127.0.0.1:0", slow_reader) as lst:
        t = await connect(lst.url)
        assert isinstance(t, StreamTransport)

        async def pump() -> None:
            nonlocal sent
            while sent < total:
                await t.send([msg])
                sent += len(msg)

        task = asyncio.create_task(pump())
        last = -1
        while sent != last:  # until progress stops (bounded: the kernel buffers are finite)
            last = sent
            await asyncio.sleep(0.05)
        assert not task.done()
        # kernel send+receive buffers (loopback autotuning reaches a few MB) plus our bounded buffers
        assert sent < 24 << 20
        assert t.buffered_out <= WRITE_HIGH_WATER + len(msg)
        release.set()
        await task
        await t.close()
        await done.wait()
    assert received == total


async def test_memory_back_pressure_is_exact() -> None:
    a, b = memory_pair(capacity=64 << 10)
    sent = 0

    async def pump() -> None:
        nonlocal sent
        for _ in range(100):
            await a.send([b"m" * (16 << 10)])
            sent += 16 << 10

    task = asyncio.create_task(pump())
    for _ in range(50):
        await asyncio.sleep(0)
    assert sent == 64 << 10 and a.buffered_out == 64 << 10 and not task.done()
    got = 0
    while got < 100 * (16 << 10):
        got += len(await b.recv())
    await task
    assert sent == got


async def test_a_second_unix_listener_on_a_live_path_fails_and_leaves_the_socket(tmp_path: Path) -> None:
    from transports import connect, listen
    from transports.urls import short_socket_dir

    async def handler(t: Transport) -> None:
        await t.close()

    with short_socket_dir("lk") as d:
        url = f"unix://{d}/gw.sock"
        first = await listen(url, handler)
        try:
            with pytest.raises(TransportError, match="another process is listening"):
                await listen(url, handler)
            assert (d / "gw.sock").exists()  # the live socket is still there
            t = await connect(url)  # and still answers
            await t.close()
        finally:
            await first.aclose()
        again = await listen(url, handler)  # free again once the first one closed
        await again.aclose()
