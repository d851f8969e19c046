"""Cancelling ShapedTransport.close() while it flushes a delayed piece must still close the inner transport
(found by the gateway daemon: a link cancelled during its Bye left the peer's socket open)."""

from __future__ import annotations

import asyncio

import pytest

from transports import LinkShape, ShapedTransport, memory_pair
from wanrt.errors import PeerLost


async def test_cancelled_close_does_not_leave_the_inner_transport_open() -> None:
    left, right = memory_pair()
    shaped = ShapedTransport(left, LinkShape(100e6, delay_s=5.0))
    await shaped.send([b"bye"])  # held on the emulated line for 5 s
    closing = asyncio.get_running_loop().create_task(shaped.close())
    await asyncio.sleep(0)  # let close() start flushing
    closing.cancel()
    await asyncio.gather(closing, return_exceptions=True)
    assert closing.cancelled()
    assert left.closed and shaped.closed
    with pytest.raises(PeerLost):  # the peer sees the connection end instead of waiting forever
        async with asyncio.timeout(2):
            await right.recv()
