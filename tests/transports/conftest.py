"""Shared helpers: a listener per transport kind whose handler echoes or records what it receives."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from transports import Listener, Transport, listen

_names = itertools.count()

KINDS = ("tcp", "unix", "mem")

ListenFactory = Callable[[Callable[[Transport], Awaitable[None]]], Awaitable[Listener]]


def url_for(kind: str, tmp_path: Path) -> str:
    if kind == "tcp":
        return "tcp://127.0.0.1:0"
    if kind == "unix":
        return f"unix://{tmp_path}/s{next(_names)}.sock"
    return f"mem://test-{next(_names)}"


async def echo(t: Transport) -> None:
    while data := await t.recv():
        await t.send([data])


async def read_all(t: Transport) -> bytes:
    out = bytearray()
    while data := await t.recv():
        out += data
    return bytes(out)


async def read_exactly(t: Transport, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        data = await t.recv(n - len(out))
        if not data:
            raise EOFError(f"EOF after {len(out)} of {n} bytes")
        out += data
    return bytes(out)


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def serve(kind: str, tmp_path: Path) -> AsyncIterator[ListenFactory]:
    """``await serve(handler)`` -> a started listener of the parametrized kind, closed at teardown."""
    listeners: list[Listener] = []

    async def start(handler: Callable[[Transport], Awaitable[None]]) -> Listener:
        lst = await listen(url_for(kind, tmp_path), handler)
        listeners.append(lst)
        return lst

    yield start
    for lst in listeners:
        await lst.aclose()
    await asyncio.sleep(0)
