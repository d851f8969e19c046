"""The daemons run on uvloop: the same transports must work there, and installing it is explicit."""

from __future__ import annotations

import asyncio

import pytest

from tests.transports.conftest import echo, read_exactly
from transports import LinkShape, ShapedTransport, TLSConfig, connect, install_uvloop, listen, memory_pair

uvloop = pytest.importorskip("uvloop", reason="uvloop is not installed")


def test_import_does_not_install_uvloop() -> None:
    import importlib

    import transports

    importlib.reload(transports)
    assert not isinstance(asyncio.get_event_loop_policy(), uvloop.EventLoopPolicy)


def test_install_uvloop_sets_the_policy() -> None:
    old = asyncio.get_event_loop_policy()
    try:
        assert install_uvloop() is True
        assert isinstance(asyncio.get_event_loop_policy(), uvloop.EventLoopPolicy)
    finally:
        asyncio.set_event_loop_policy(old)


def test_tcp_tls_and_shaping_under_uvloop(tls_files: dict[str, str]) -> None:
    async def main() -> None:
        server = TLSConfig(certfile=tls_files["server_cert"], keyfile=tls_files["server_key"])
        async with await listen("tcp://127.0.0.1:0", echo, tls=server) as lst:
            t = await connect(lst.url, tls=TLSConfig(cafile=tls_files["ca"]))
            blob = bytes(range(256)) * 2000
            await t.send([memoryview(blob)[:7], memoryview(blob)[7:]])
            assert await read_exactly(t, len(blob)) == blob
            await t.close()
        a, b = memory_pair()
        shaped = ShapedTransport(a, LinkShape(rate_bps=1e9, delay_s=0.01))
        await shaped.send([b"paced"])
        assert await read_exactly(b, 5) == b"paced"
        await shaped.close()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())
