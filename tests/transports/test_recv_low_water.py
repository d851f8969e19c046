"""``StreamTransport.expect``: a reader that knows the rest of a frame is still to come lets the kernel
gather it (SO_RCVLOWAT) instead of waking per few KB, and is never left waiting for bytes that are
already here, that end the frame short of the mark, or that never come (EOF)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np
import pytest

from transports import Transport, connect, listen
from transports.stream import MAX_RECV_LOW_WATER, StreamTransport
from wanrt.protocol.frame import FrameReader, encode_frame

uvloop = pytest.importorskip("uvloop", reason="uvloop is not installed")


def _lowat(t: StreamTransport) -> int:
    sock = t.get_extra_info("socket")
    assert isinstance(sock, object)
    return int(sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT))  # type: ignore[attr-defined]


def _run(loop_kind: str, main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    if loop_kind == "uvloop":
        uvloop.run(main())
    else:
        asyncio.run(main())


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_rest_of_a_frame_arrives_in_pieces_and_at_eof(loop_kind: str) -> None:
    async def main() -> None:
        got: asyncio.Queue[bytes] = asyncio.Queue()
        marks: list[int] = []
        frame = {"end": 0, "rcvd": 0}  # where the announced "frame" ends in the stream; bytes read

        async def reader(t: Transport) -> None:
            assert isinstance(t, StreamTransport)
            while True:
                data = await t.recv(1 << 18)
                frame["rcvd"] += len(data)
                await got.put(data)
                if not data:
                    return
                t.expect(max(0, frame["end"] - frame["rcvd"]))
                marks.append(_lowat(t))

        async def take(n: int) -> bytes:
            out = b""
            while len(out) < n:
                out += await asyncio.wait_for(got.get(), 10)
            return out

        async with await listen("tcp://127.0.0.1:0", reader) as lst:
            t = await connect(lst.url)
            total = 3 * MAX_RECV_LOW_WATER + 1000
            frame["end"] = total
            blob = bytes(range(256)) * (total // 256) + b"x" * (total % 256)
            # the first piece: the reader sets the mark to what the "frame" still lacks (capped); the rest
            # goes in pieces smaller than the mark, and the last mark (below the cap) is exactly what
            # completes the frame: never a wait for bytes that do not come
            await t.send([blob[:1000]])
            first = await take(1000)
            off = 1000
            while off < total:
                step = min(7000, total - off)
                await t.send([blob[off : off + step]])
                off += step
            assert first + await take(total - 1000) == blob
            assert max(marks) == MAX_RECV_LOW_WATER
            assert marks[-1] == 1  # between frames: wake on any byte
            # part of a "frame", then EOF before the mark is reached: the reader still wakes, gets the
            # bytes, then b""
            frame["end"] = total + 100_000
            await t.send([b"y" * 10])
            assert await take(10) == b"y" * 10
            assert marks[-1] == MAX_RECV_LOW_WATER
            await t.send([b"z" * 10])
            await t.close()
            rest = b""
            while (data := await asyncio.wait_for(got.get(), 10)) != b"":
                rest += data
            assert rest == b"z" * 10

    _run(loop_kind, main)


def test_frame_reader_reports_the_bytes_a_frame_still_lacks() -> None:
    body = np.arange(1 << 14, dtype=np.float32)
    wire = b"".join(bytes(v) for v in encode_frame(1, 0x10, {"k": 1}, [body]))
    r = FrameReader()
    assert r.missing == 0
    r.feed(wire[:5])  # the fixed header is incomplete: the frame's length is not known yet
    assert r.next_frame(lambda fixed: None) is None
    assert r.missing == 0
    r.feed(wire[5:1000])
    assert r.next_frame(lambda fixed: None) is None
    assert r.missing == len(wire) - 1000
    r.feed(wire[1000:-1])
    assert r.next_frame(lambda fixed: None) is None
    assert r.missing == 1
    r.feed(wire[-1:])
    assert r.next_frame(lambda fixed: None) is not None
    assert r.missing == 0


async def test_tls_and_unix_transports_leave_the_mark_alone(tls_files: dict[str, str], tmp_path: Any) -> None:
    from transports import TLSConfig

    seen: list[int] = []

    async def reader(t: Transport) -> None:
        assert isinstance(t, StreamTransport)
        await t.recv(10)
        t.expect(100_000)  # TLS: part of the frame may sit encrypted in the TLS layer; unix: ignored
        seen.append(t._lowat)
        await t.close()

    server = TLSConfig(certfile=tls_files["server_cert"], keyfile=tls_files["server_key"])
    for url, tls_server, tls_client in (
        ("tcp://127.0.0.1:0", server, TLSConfig(cafile=tls_files["ca"])),
        (f"unix://{tmp_path}/s.sock", None, None),
    ):
        async with await listen(url, reader, tls=tls_server) as lst:
            t = await connect(lst.url, tls=tls_client)
            await t.send([b"x" * 10])
            assert await asyncio.wait_for(t.recv(10), 10) == b""
            await t.close()
    assert seen == [1, 1]
