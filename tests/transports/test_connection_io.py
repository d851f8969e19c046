"""``next_event`` / ``abort_and_close``: a sans-IO Connection driven over a real Transport, as both the
gateway's links and the trainer client's link use them."""

from __future__ import annotations

import pytest

from tests.wanrt.protocol.pair import authenticated_pair
from transports import memory_pair
from transports.connection_io import RECV_BYTES, abort_and_close, next_event
from wanrt.errors import LocalProtocolError, WanrtTimeout
from wanrt.protocol import Bye, ConnectionClosed, Error, Heartbeat


async def test_messages_then_the_clean_end_of_the_stream() -> None:
    pair = authenticated_pair()
    near, far = memory_pair()
    await far.send(pair.client.send_parts(Heartbeat(1, 0.5)))
    await far.send(pair.client.send_parts(Heartbeat(2, 0.5)))
    await far.send(pair.client.send_parts(Bye("done")))
    await far.close()
    reads: list[int] = []
    waits: list[None] = []
    got = [
        await next_event(pair.server, near, count=reads.append, before_read=lambda: waits.append(None))
        for _ in range(3)
    ]
    assert got[:2] == [Heartbeat(1, 0.5), Heartbeat(2, 0.5)] and got[2] == Bye("done")
    pair.server.send_parts(Bye())  # both sides said Bye: the EOF that follows is a clean close
    end = await next_event(pair.server, near)
    assert isinstance(end, ConnectionClosed) and end.clean
    assert sum(reads) > 0 and all(0 < n <= RECV_BYTES for n in reads) and len(waits) >= 1


async def test_a_silent_peer_is_a_heartbeat_timeout() -> None:
    pair = authenticated_pair()
    near, _far = memory_pair()
    with pytest.raises(WanrtTimeout) as info:
        await next_event(pair.server, near, idle=0.01)
    assert info.value.fields["phase"] == "heartbeat"


async def test_abort_and_close_tells_the_peer_why_then_closes() -> None:
    pair = authenticated_pair()
    near, far = memory_pair()
    await abort_and_close(pair.server, near, LocalProtocolError("we broke it"), grace=1.0)
    assert near.closed
    error = pair.s2c(await far.recv())[0]
    assert isinstance(error, Error) and "we broke it" in error.message
    assert await far.recv() == b""  # then the end of the stream
    await abort_and_close(pair.server, near, None, grace=1.0)  # again: nothing left to say, no error
