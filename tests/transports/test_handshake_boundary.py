"""``handshake_boundary``: every way a handshake fails is reported typed, ends only that connection, and
tells the peer why exactly when the peer was refused (else the last frame says only "aborted"); the
services' accept and dial paths use it."""

from __future__ import annotations

import asyncio

import pytest

from tests.wanrt.protocol.pair import authenticated_pair
from transports import memory_pair
from transports.handshake_boundary import HandshakeFailure, handshake_boundary
from wanrt.errors import AuthError, RemoteProtocolError, TransportError, WanrtTimeout
from wanrt.protocol import Error


async def _fail(exc: BaseException) -> tuple[list[HandshakeFailure], str, bool]:
    """Raise ``exc`` inside the boundary; what was reported, the peer's last frame's message, whether
    the transport is closed."""
    pair = authenticated_pair()
    near, far = memory_pair()
    seen: list[HandshakeFailure] = []
    async with handshake_boundary(pair.server, near, grace=1.0, on_failure=seen.append) as guard:
        raise exc
    assert guard.failed and guard.failure == seen[0]
    received = b""
    while chunk := await far.recv():
        received += chunk
    error = pair.s2c(received)[0]
    assert isinstance(error, Error)
    return seen, error.message, near.closed


async def test_a_refused_peer_is_told_why_and_reported_typed() -> None:
    seen, told, closed = await _fail(AuthError("wrong secret", peer="x"))
    assert [f.kind for f in seen] == ["refused"] and seen[0].auth and str(seen[0]).startswith("wrong secret")
    assert closed and "wrong secret" in told
    seen, told, _ = await _fail(RemoteProtocolError("bad frame", peer="x"))
    assert seen[0].kind == "refused" and not seen[0].auth and "bad frame" in told


async def test_timeouts_and_failed_transports_tell_the_peer_no_reason() -> None:
    seen, told, closed = await _fail(TimeoutError())
    assert seen == [HandshakeFailure("timeout")] and str(seen[0]) == "handshake not finished in time"
    assert told == "aborted" and closed
    seen, told, _ = await _fail(WanrtTimeout("send took too long", phase="send", seconds=1.0))
    assert seen[0].kind == "timeout" and isinstance(seen[0].error, WanrtTimeout) and told == "aborted"
    seen, told, _ = await _fail(TransportError("reset", peer="x"))
    assert seen[0].kind == "transport" and told == "aborted"


async def test_success_reports_nothing_and_leaves_the_connection_open() -> None:
    pair = authenticated_pair()
    near, _far = memory_pair()
    seen: list[HandshakeFailure] = []
    async with handshake_boundary(pair.server, near, grace=1.0, on_failure=seen.append) as guard:
        pass
    assert not guard.failed and seen == [] and not near.closed


async def test_cancellation_closes_the_connection_and_propagates() -> None:
    pair = authenticated_pair()
    near, _far = memory_pair()
    seen: list[HandshakeFailure] = []

    async def handshake() -> None:
        async with handshake_boundary(pair.server, near, grace=1.0, on_failure=seen.append):
            await asyncio.Event().wait()

    task = asyncio.create_task(handshake())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert near.closed and seen == []


async def test_a_bug_is_not_swallowed() -> None:
    pair = authenticated_pair()
    near, _far = memory_pair()
    with pytest.raises(KeyError):
        async with handshake_boundary(pair.server, near, grace=1.0, on_failure=lambda f: None):
            raise KeyError("a bug: the listener's tracker logs it and closes only this connection")
