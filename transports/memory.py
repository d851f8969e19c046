"""In-process transports: a connected pair with bounded buffers, and a ``mem://name`` listener registry.

For tests and the single-process simulator: two endpoints talk without sockets, yet the buffers are bounded
(``capacity`` bytes per direction), so back-pressure, EOF and reset behave like a real socket and code
tested over a memory pair does not break on TCP. The registry is kept per event loop, so a listener left
behind by one test cannot capture another test's connections.
"""

from __future__ import annotations

import asyncio
import itertools
import weakref
from collections.abc import Sequence

from transports.base import ConnectionTracker, Handler, Listener, Transport, Wrap, as_byte_views
from transports.timeouts import DEFAULT_TIMEOUTS, Timeouts, deadline
from wanrt.errors import LocalProtocolError, PeerLost, TransportError

__all__ = [
    "DEFAULT_CAPACITY",
    "MemoryListener",
    "MemoryTransport",
    "listen_memory",
    "memory_pair",
    "open_memory",
]

#: Bytes buffered per direction: large enough for a 16 KiB-framed stream to flow, small enough that a
#: stalled reader blocks the writer quickly (like a socket's send + receive buffers).
DEFAULT_CAPACITY = 256 * 1024


class _Pipe:
    """One direction: a bounded byte FIFO with EOF (clean close) and reset (abort) flags."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.buf = bytearray()
        self.eof = False  # writer closed: reader drains the rest, then gets b""
        self.reset = False  # writer aborted: reader gets PeerLost at once
        self.reader_gone = False  # reader closed: writer gets PeerLost
        self.readable = asyncio.Event()
        self.writable = asyncio.Event()
        self.writable.set()

    def wake_all(self) -> None:
        self.readable.set()
        self.writable.set()


class MemoryTransport:
    """One end of an in-memory connection (see :func:`memory_pair`)."""

    def __init__(
        self, peer: str, inbound: _Pipe, outbound: _Pipe, timeouts: Timeouts = DEFAULT_TIMEOUTS
    ) -> None:
        self.peer = peer
        self._in = inbound
        self._out = outbound
        self._timeouts = timeouts
        self._closed = False
        self._send_lock = asyncio.Lock()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def buffered_out(self) -> int:
        """Bytes sent but not yet received by the peer (bounded by the capacity)."""
        return len(self._out.buf)

    async def send(self, parts: Sequence[bytes | memoryview]) -> None:
        if self._closed:
            raise TransportError("send on a closed transport", peer=self.peer)
        views = as_byte_views(parts)
        try:
            async with self._send_lock:
                await deadline(self._write(views), self._timeouts.send, "send", self.peer)
        except BaseException as exc:
            if not isinstance(exc, TransportError):
                self.abort()  # half a message is in the pipe: the stream cannot be resumed
            raise

    async def _write(self, views: list[memoryview]) -> None:
        pipe = self._out
        for mv in views:
            off, n = 0, len(mv)
            while off < n:
                if self._closed:
                    raise TransportError("transport closed during send", peer=self.peer)
                if pipe.reader_gone:
                    raise PeerLost("peer closed the connection", peer=self.peer)
                space = pipe.capacity - len(pipe.buf)
                if space <= 0:
                    pipe.writable.clear()
                    await pipe.writable.wait()
                    continue
                take = min(space, n - off)
                pipe.buf += mv[off : off + take]
                off += take
                pipe.readable.set()

    async def recv(self, max_bytes: int = 1 << 20) -> bytes:
        if self._closed:
            raise TransportError("recv on a closed transport", peer=self.peer)
        if max_bytes < 1:  # b"" would be indistinguishable from EOF
            raise LocalProtocolError("recv needs max_bytes >= 1", peer=self.peer, value=max_bytes)
        return await deadline(self._read(max_bytes), self._timeouts.recv_idle, "recv_idle", self.peer)

    async def _read(self, max_bytes: int) -> bytes:
        pipe = self._in
        while True:
            if pipe.reset:
                raise PeerLost("connection reset by peer", peer=self.peer)
            if pipe.buf:
                out = bytes(pipe.buf[:max_bytes])
                del pipe.buf[:max_bytes]
                pipe.writable.set()
                return out
            if pipe.eof:
                return b""
            if self._closed:
                raise TransportError("transport closed during recv", peer=self.peer)
            pipe.readable.clear()
            await pipe.readable.wait()

    async def close(self) -> None:
        """Graceful: the peer reads what is buffered, then EOF; the peer's later sends get PeerLost."""
        if self._closed:
            return
        self._closed = True
        self._out.eof = True
        self._in.reader_gone = True
        self._in.buf.clear()
        self._out.wake_all()
        self._in.wake_all()

    def abort(self) -> None:
        """Like a TCP reset: buffered bytes are dropped and the peer's recv raises PeerLost."""
        self._closed = True
        self._out.reset = True
        self._out.buf.clear()
        self._in.reader_gone = True
        self._in.buf.clear()
        self._out.wake_all()
        self._in.wake_all()


def memory_pair(
    a: str = "mem://a",
    b: str = "mem://b",
    *,
    capacity: int = DEFAULT_CAPACITY,
    timeouts: Timeouts = DEFAULT_TIMEOUTS,
) -> tuple[MemoryTransport, MemoryTransport]:
    """Two connected transports; ``a``/``b`` name each end (so the first one's ``peer`` is ``b``)."""
    if capacity < 1:
        raise ValueError("capacity must be >= 1")
    ab, ba = _Pipe(capacity), _Pipe(capacity)
    return MemoryTransport(b, ba, ab, timeouts), MemoryTransport(a, ab, ba, timeouts)


_registries: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, MemoryListener]] = (
    weakref.WeakKeyDictionary()
)


def _registry() -> dict[str, MemoryListener]:
    loop = asyncio.get_running_loop()
    reg = _registries.get(loop)
    if reg is None:
        reg = _registries[loop] = {}
    return reg


class MemoryListener(Listener):
    """Accepts ``mem://name`` connections from the same event loop."""

    def __init__(
        self,
        name: str,
        handler: Handler,
        timeouts: Timeouts,
        capacity: int,
        wrap: Wrap | None = None,
    ) -> None:
        super().__init__(f"mem://{name}", name, ConnectionTracker(f"listener mem://{name}"), timeouts.close)
        self.name = name
        self._handler = handler
        self._timeouts = timeouts
        self._capacity = capacity
        self._wrap = wrap
        self._ids = itertools.count(1)
        self._registry = _registry()

    def _accept(self, client_timeouts: Timeouts) -> MemoryTransport:
        ours, theirs = memory_pair(
            f"mem://{self.name}#{next(self._ids)}", f"mem://{self.name}", capacity=self._capacity
        )
        # each end applies its own side's timeouts
        ours._timeouts, theirs._timeouts = client_timeouts, self._timeouts
        server_end: Transport = theirs
        if self._wrap is not None:
            server_end = self._wrap(theirs)
        self._tracker.spawn(server_end, self._handler)
        return ours

    def _stop_accepting(self) -> None:
        # the registry captured at listen time: close() may run after the loop stopped
        if self._registry.get(self.name) is self:
            del self._registry[self.name]


async def listen_memory(
    name: str,
    handler: Handler,
    *,
    timeouts: Timeouts = DEFAULT_TIMEOUTS,
    capacity: int = DEFAULT_CAPACITY,
    wrap: Wrap | None = None,
) -> MemoryListener:
    reg = _registry()
    if name in reg:
        raise TransportError(f"mem://{name} is already listening", url=f"mem://{name}")
    listener = MemoryListener(name, handler, timeouts, capacity, wrap)
    reg[name] = listener
    return listener


async def open_memory(name: str, *, timeouts: Timeouts = DEFAULT_TIMEOUTS) -> MemoryTransport:
    listener = _registry().get(name)
    if listener is None or not listener.accepting:
        raise TransportError(f"cannot connect to mem://{name}: nobody listening", url=f"mem://{name}")
    return listener._accept(timeouts)
