"""``serve_connection``: the reader/writer life every long-lived connection runs — who ends it, what the
owner hears, and how the transport is closed (clean, with a last Error frame, dropped, or cancelled)."""

from __future__ import annotations

import asyncio

import pytest

from tests.wanrt.protocol.pair import authenticated_pair
from transports import memory_pair
from transports.connection_serving import ConnectionEnd, serve_connection
from wanrt.errors import RemoteProtocolError
from wanrt.protocol import Error


async def _forever() -> str:
    await asyncio.Event().wait()
    return "never"


async def _returns(reason: str) -> str:
    return reason


async def _raises(exc: BaseException) -> str:
    raise exc


async def test_the_reader_s_reason_ends_it_and_the_peer_gets_no_reason() -> None:
    pair = authenticated_pair()
    near, far = memory_pair()
    told: list[ConnectionEnd] = []
    end = await serve_connection(
        pair.server,
        near,
        reader=_returns("peer said bye"),
        writer=_forever(),
        name="t",
        grace=1.0,
        on_end=told.append,
    )
    assert end.reason == "peer said bye" and end.error is None and told == [end] and near.closed
    received = b""
    while chunk := await far.recv():
        received += chunk
    error = pair.s2c(received)[0]  # not a protocol error: the last frame gives no reason
    assert isinstance(error, Error) and error.message == "aborted"


async def test_a_protocol_violation_is_told_to_the_peer() -> None:
    pair = authenticated_pair()
    near, far = memory_pair()
    end = await serve_connection(
        pair.server,
        near,
        reader=_raises(RemoteProtocolError("garbage", peer="p")),
        writer=_forever(),
        name="t",
        grace=1.0,
        describe=lambda e: f"violation: {e}",
    )
    assert end.reason.startswith("violation: garbage") and isinstance(end.error, RemoteProtocolError)
    error = pair.s2c(await far.recv())[0]
    assert isinstance(error, Error) and "garbage" in error.message


async def test_the_stop_order_and_settle_decide_the_verdict() -> None:
    pair = authenticated_pair()
    near, far = memory_pair()
    stop = asyncio.Event()
    stop.set()

    def settle(end: ConnectionEnd) -> None:
        end.reason, end.clean = "closed by the node", True

    end = await serve_connection(
        pair.server,
        near,
        reader=_forever(),
        writer=_forever(),
        name="t",
        grace=1.0,
        stop=stop,
        settle=settle,
        flush_when_clean=True,
    )
    assert end.reason == "closed by the node" and end.clean and near.closed
    assert await far.recv() == b""  # a clean end: no Error frame, just the end of the stream


async def test_cancelled_serving_cancels_both_tasks_tells_the_owner_and_closes() -> None:
    pair = authenticated_pair()
    near, _far = memory_pair()
    started = asyncio.Event()
    told: list[ConnectionEnd] = []
    cancelled: list[str] = []

    async def reader() -> str:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append("reader")
            raise
        return "never"

    task = asyncio.create_task(
        serve_connection(
            pair.server,
            near,
            reader=reader(),
            writer=_forever(),
            name="t",
            grace=1.0,
            on_end=told.append,
            cancelled_reason="shutting down",
        )
    )
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancelled == ["reader"] and [e.reason for e in told] == ["shutting down"] and near.closed
