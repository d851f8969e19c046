"""TCP tuning of WAN links: ``set_congestion`` runs the congestion control the gateway config names (a
name the kernel refuses leaves the host's default, with a reason for the log; non-TCP transports are left
alone), and a TCP transport acknowledges at once after every read."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from transports import Transport, connect, listen
from transports.congestion import set_congestion

uvloop = pytest.importorskip("uvloop", reason="uvloop is not installed")
pytestmark = pytest.mark.skipif(not hasattr(socket, "TCP_CONGESTION"), reason="no TCP_CONGESTION here")


def kernel_congestion_controls(which: str = "available") -> list[str]:
    """The kernel's ``available`` (loaded) or ``allowed`` (settable by anyone) congestion controls."""
    try:
        with open(f"/proc/sys/net/ipv4/tcp_{which}_congestion_control") as f:
            return f.read().split()
    except OSError:
        return []


def _current(t: Transport) -> str:
    sock: Any = t.get_extra_info("socket")  # type: ignore[attr-defined]
    return bytes(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16)).split(b"\0")[0].decode()


def _run(loop_kind: str, main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    if loop_kind == "uvloop":
        uvloop.run(main())
    else:
        asyncio.run(main())


async def _pair(body: Callable[[Transport], Coroutine[Any, Any, None]]) -> None:
    async def serve(t: Transport) -> None:
        await t.recv(1)

    async with await listen("tcp://127.0.0.1:0", serve) as lst:
        t = await connect(lst.url)
        try:
            await body(t)
        finally:
            await t.close()


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_each_available_algorithm_is_set_on_the_link(loop_kind: str) -> None:
    names = [n for n in ("cubic", "reno", "bbr") if n in kernel_congestion_controls()]
    if not names:
        pytest.skip("the kernel lists no congestion control we know")

    async def body(t: Transport) -> None:
        for name in names:
            assert set_congestion(t, name) is None
            assert _current(t) == name

    _run(loop_kind, lambda: _pair(body))


def test_a_name_the_kernel_lacks_leaves_the_default_and_says_why() -> None:
    async def body(t: Transport) -> None:
        before = _current(t)
        why = set_congestion(t, "nosuchcc")
        assert why is not None and "'nosuchcc'" in why and "host's default" in why
        assert _current(t) == before

    asyncio.run(_pair(body))


def test_empty_name_and_non_tcp_transports_are_left_alone(tmp_path: Any) -> None:
    async def main() -> None:
        async def serve(t: Transport) -> None:
            await t.recv(1)

        async with await listen(f"unix://{tmp_path}/s.sock", serve) as lst:
            t = await connect(lst.url)
            assert set_congestion(t, "cubic") is None  # unix socket: nothing to set, nothing wrong
            await t.close()

        async def body(t: Transport) -> None:
            before = _current(t)
            assert set_congestion(t, "") is None
            assert _current(t) == before

        await _pair(body)
        assert set_congestion(object(), "cubic") is None  # no socket at all (an in-memory transport)

    asyncio.run(main())


def _quickack(t: Transport) -> int:
    sock: Any = t.get_extra_info("socket")  # type: ignore[attr-defined]
    return int(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK))


async def _after_a_reply_and_more_data(monkeypatch: pytest.MonkeyPatch | None) -> int:
    """The accepting end reads, replies at once (Linux then holds its ACKs back, taking the link for an
    interactive one), reads again: is it acknowledging at once right after that read?"""
    import transports.stream as stream

    if monkeypatch is not None:
        monkeypatch.setattr(stream, "_QUICKACK", None)  # a transport that never asks for quick ACKs
    seen: asyncio.Queue[int] = asyncio.Queue()

    async def serve(t: Transport) -> None:
        await t.recv(1 << 16)
        await t.send([b"reply"])
        await t.recv(1 << 16)
        await seen.put(_quickack(t))
        await t.recv(1)

    async with await listen("tcp://127.0.0.1:0", serve) as lst:
        t = await connect(lst.url)
        await t.send([b"x" * 20_000])
        await t.recv(5)
        await t.send([b"y" * 20_000])
        got = await asyncio.wait_for(seen.get(), 10)
        await t.close()
    return got


@pytest.mark.skipif(not hasattr(socket, "TCP_QUICKACK"), reason="no TCP_QUICKACK here")
def test_a_tcp_link_acknowledges_at_once_after_every_read(monkeypatch: pytest.MonkeyPatch) -> None:
    if asyncio.run(_after_a_reply_and_more_data(monkeypatch)) != 0:
        pytest.skip("this kernel does not delay ACKs on a link that replies (nothing to re-arm)")
    monkeypatch.undo()
    assert asyncio.run(_after_a_reply_and_more_data(None)) == 1
