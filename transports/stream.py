"""TCP and unix-domain sockets on asyncio streams: the real byte movers.

One code path for both socket families: ``writelines`` of the parts then ``await drain()`` gives
back-pressure from the kernel socket buffer and the transport's write-buffer high-water mark; ``read`` with
a bounded reader buffer pauses the socket when the application falls behind, so TCP flow control reaches
the sender. TLS is layered with ``start_tls`` *after* the TCP connect so a timeout says which phase stalled.
Works unchanged under uvloop (installed only by daemon entry points, see :mod:`transports.loop`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import struct
from collections.abc import Callable, Sequence

from transports.base import ConnectionTracker, Handler, Listener, Transport, Wrap, as_byte_views
from transports.timeouts import DEFAULT_TIMEOUTS, Timeouts, deadline
from transports.tls import TLSConfig
from wanrt.errors import AuthError, LocalProtocolError, PeerLost, TransportError, WanrtTimeout

__all__ = [
    "READ_BUFFER_LIMIT",
    "WRITE_HIGH_WATER",
    "StreamListener",
    "StreamTransport",
    "listen_tcp",
    "listen_unix",
    "open_tcp",
    "open_unix",
]

#: StreamReader limit: it pauses the socket once it buffers 2× this, bounding memory per connection while
#: letting one ``recv`` return a useful amount (a 64 KiB default costs ~2× throughput on loopback).
READ_BUFFER_LIMIT = 256 * 1024
#: Write-buffer high-water mark: ``drain`` blocks above it, so at most this much sits in user space per
#: connection beyond the kernel's socket buffer.
WRITE_HIGH_WATER = 256 * 1024

#: Most a reader asks the kernel to gather before waking it (:meth:`StreamTransport.expect`): a quarter of
#: the reader's buffer, so a woken read still finds room, and at 100 Mbit/s ~5 ms of bytes.
MAX_RECV_LOW_WATER = READ_BUFFER_LIMIT // 4

_RESET_ERRORS = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)

#: ``TCP_QUICKACK`` where the platform has it (Linux): see :meth:`StreamTransport.recv`.
_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)


class StreamTransport:
    """A :class:`~transports.base.Transport` over an asyncio (reader, writer) pair."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        peer: str,
        timeouts: Timeouts = DEFAULT_TIMEOUTS,
    ) -> None:
        self.peer = peer
        self._reader = reader
        self._writer = writer
        self._timeouts = timeouts
        self._closed = False
        writer.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        sock = writer.get_extra_info("socket")
        tcp = sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6)
        plain = writer.get_extra_info("ssl_object") is None
        self._lowat_sock = sock if tcp and plain else None  # see expect()
        self._lowat = 1
        self._quickack_sock = sock if tcp and _QUICKACK is not None else None  # see recv()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def buffered_out(self) -> int:
        """Bytes in the user-space write buffer (bounded by WRITE_HIGH_WATER + one message)."""
        return self._writer.transport.get_write_buffer_size()

    @property
    def tls(self) -> bool:
        return self._writer.get_extra_info("ssl_object") is not None

    def get_extra_info(self, name: str, default: object = None) -> object:
        """Socket details (``peername``, ``peercert``, ``ssl_object``, ...) from the asyncio transport."""
        return self._writer.get_extra_info(name, default)

    async def send(self, parts: Sequence[bytes | memoryview]) -> None:
        if self._closed:
            raise TransportError("send on a closed transport", peer=self.peer)
        if self._writer.transport.is_closing():
            raise PeerLost("connection lost", peer=self.peer)
        self._writer.writelines(as_byte_views(parts))  # uvloop wants flat byte buffers
        try:
            await deadline(self._writer.drain(), self._timeouts.send, "send", self.peer)
        except WanrtTimeout:
            self.abort()  # a half-written message can never be resumed: drop the connection
            raise
        except _RESET_ERRORS as exc:
            raise PeerLost(f"connection lost while sending: {exc}", peer=self.peer) from None
        except ssl.SSLError as exc:
            raise TransportError(f"TLS error while sending: {exc}", peer=self.peer) from None
        except OSError as exc:
            raise TransportError(f"send failed: {exc}", peer=self.peer) from None
        except BaseException:
            self.abort()  # cancelled mid-message: same reasoning as the timeout
            raise

    async def recv(self, max_bytes: int = 1 << 20) -> bytes:
        if self._closed:
            raise TransportError("recv on a closed transport", peer=self.peer)
        if max_bytes < 1:  # read(0) would return b"", indistinguishable from EOF
            raise LocalProtocolError("recv needs max_bytes >= 1", peer=self.peer, value=max_bytes)
        try:
            data = await deadline(
                self._reader.read(max_bytes), self._timeouts.recv_idle, "recv_idle", self.peer
            )
        except WanrtTimeout:
            raise  # (a TimeoutError is an OSError: keep it out of the clauses below)
        except _RESET_ERRORS as exc:
            raise PeerLost(f"connection reset: {exc}", peer=self.peer) from None
        except ssl.SSLError as exc:
            raise TransportError(f"TLS error while receiving: {exc.reason or exc}", peer=self.peer) from None
        except OSError as exc:
            raise TransportError(f"recv failed: {exc}", peer=self.peer) from None
        if data and self._quickack_sock is not None:
            # Acknowledge at once, not after the delayed-ACK timer: both ends of a link send (rounds go
            # both ways, acks and heartbeats answer data), so Linux takes the connection for an interactive
            # one and holds ACKs back to ride on a reply; a sender whose window is smaller than a message
            # (cubic on bursty sparse rounds: 30 packets for a 104 kB message) then waited for them: 10 ms
            # between the first 22 kB and the rest on a 100 Mbit/s link (docs/round_bench.md, Session 14).
            # The mode is not sticky, so it is asked for again after every read.
            with contextlib.suppress(OSError):
                self._quickack_sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
        return data

    def expect(self, missing: int) -> None:
        """The receiver cannot use fewer than ``missing`` more bytes (the rest of a frame): let the kernel
        gather up to that many (at most :data:`MAX_RECV_LOW_WATER`) before the event loop is woken, instead
        of a wake-up, a read and a parse for every few kilobytes of a large frame (a gateway's WAN link
        delivered 5 KB per read at 100 Mbit/s, ~3 000 reads per 5 M round: docs/round_bench.md).

        Safe by construction: only bytes already promised by a frame header are waited for, and only when
        nothing is buffered in user space; Linux wakes a reader below the mark anyway at EOF, on an error,
        under memory pressure, or when the receive window would close (``tcp_epollin_ready``). A no-op on
        anything but plain TCP: unix sockets' poll ignores the mark, and under TLS part of the frame may
        already sit, still encrypted, in the TLS layer, so fewer wire bytes than ``missing`` may be left."""
        sock = self._lowat_sock
        if sock is None or self._closed:
            return
        if missing <= 1 or len(getattr(self._reader, "_buffer", b"x")):
            want = 1  # between frames, or bytes already here that the next recv returns at once
        else:
            want = min(missing, MAX_RECV_LOW_WATER)
        if want != self._lowat:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, want)
                self._lowat = want

    async def close(self) -> None:
        """Flush and close (TLS: with close_notify) under ``timeouts.close``; abort when that expires."""
        if self._closed:
            return
        self._closed = True
        self._writer.close()
        try:
            await deadline(self._writer.wait_closed(), self._timeouts.close, "close", self.peer)
        except WanrtTimeout:
            self._writer.transport.abort()  # the peer does not take our last bytes: give up on them
        except (OSError, ssl.SSLError):
            pass  # the peer reset while we were closing: closed either way
        except BaseException:
            self._writer.transport.abort()  # cancelled while closing: drop it, keep the cancellation
            raise

    def abort(self) -> None:
        """Drop the connection at once; on TCP the peer sees a reset (RST), not a clean EOF."""
        self._closed = True
        sock = self._writer.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self._writer.transport.abort()


def _tune(writer: asyncio.StreamWriter, sock_buffer: int | None) -> None:
    sock = writer.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if sock_buffer:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sock_buffer)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, sock_buffer)


def _tcp_name(addr: object) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        host = str(addr[0])
        return f"tcp://[{host}]:{addr[1]}" if ":" in host else f"tcp://{host}:{addr[1]}"
    return f"tcp://{addr}"


async def _start_tls(
    writer: asyncio.StreamWriter, url: str, host: str | None, tls: TLSConfig, timeouts: Timeouts
) -> None:
    try:
        await deadline(
            writer.start_tls(
                tls.client_context(),
                server_hostname=tls.server_hostname or host,
                # asyncio's own limit is only a backstop: ours fires first and names the phase
                ssl_handshake_timeout=timeouts.handshake + 1.0,
            ),
            timeouts.handshake,
            "handshake",
            url,
        )
    except WanrtTimeout:
        writer.transport.abort()
        raise
    except ssl.SSLCertVerificationError as exc:
        writer.transport.abort()
        raise AuthError(f"TLS certificate of {url} rejected: {exc.verify_message}", peer=url) from None
    except (ssl.SSLError, OSError) as exc:
        writer.transport.abort()
        raise TransportError(f"TLS handshake with {url} failed: {exc!r}", peer=url, url=url) from None
    except BaseException:
        writer.transport.abort()
        raise


async def open_tcp(
    host: str,
    port: int,
    *,
    tls: TLSConfig | None = None,
    timeouts: Timeouts = DEFAULT_TIMEOUTS,
    sock_buffer: int | None = None,
) -> StreamTransport:
    url = _tcp_name((host, port))
    try:
        reader, writer = await deadline(
            asyncio.open_connection(host, port, limit=READ_BUFFER_LIMIT), timeouts.connect, "connect", url
        )
    except WanrtTimeout:
        raise
    except OSError as exc:
        raise TransportError(f"cannot connect to {url}: {exc.strerror or exc}", peer=url, url=url) from None
    _tune(writer, sock_buffer)
    if tls is not None:
        await _start_tls(writer, url, host, tls, timeouts)
    return StreamTransport(reader, writer, url, timeouts)


async def open_unix(
    path: str, *, tls: TLSConfig | None = None, timeouts: Timeouts = DEFAULT_TIMEOUTS
) -> StreamTransport:
    url = f"unix://{path}"
    try:
        reader, writer = await deadline(
            asyncio.open_unix_connection(path, limit=READ_BUFFER_LIMIT), timeouts.connect, "connect", url
        )
    except WanrtTimeout:
        raise
    except OSError as exc:
        raise TransportError(f"cannot connect to {url}: {exc.strerror or exc}", peer=url, url=url) from None
    if tls is not None:
        await _start_tls(writer, url, None, tls, timeouts)
    return StreamTransport(reader, writer, url, timeouts)


class StreamListener(Listener):
    """A TCP or unix listener built on :class:`asyncio.Server`."""

    def __init__(
        self,
        server: asyncio.Server,
        url: str,
        address: object,
        tracker: ConnectionTracker,
        timeouts: Timeouts,
        unix_path: str | None = None,
        unix_lock: int | None = None,
    ) -> None:
        super().__init__(url, address, tracker, timeouts.close)
        self._server = server
        self._unix_path = unix_path
        self._unix_lock = unix_lock

    def _stop_accepting(self) -> None:
        self._server.close()

    async def _after_closed(self) -> None:
        await self._server.wait_closed()
        if self._unix_path is not None:
            # Python 3.11 leaves the socket file behind; a stale file would make the path look taken.
            with contextlib.suppress(OSError):
                os.unlink(self._unix_path)
        if self._unix_lock is not None:
            os.close(self._unix_lock)  # releases the flock: the path is free for the next listener
            self._unix_lock = None


def _acceptor(
    tracker: ConnectionTracker,
    handler: Handler,
    timeouts: Timeouts,
    name: Callable[[asyncio.StreamWriter], str],
    sock_buffer: int | None,
    wrap: Wrap | None,
) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], object]:
    async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _tune(writer, sock_buffer)
        transport: Transport = StreamTransport(reader, writer, name(writer), timeouts)
        if wrap is not None:
            transport = wrap(transport)
        await tracker.run(transport, handler)

    return accepted


async def listen_tcp(
    host: str,
    port: int,
    handler: Handler,
    *,
    tls: TLSConfig | None = None,
    timeouts: Timeouts = DEFAULT_TIMEOUTS,
    sock_buffer: int | None = None,
    wrap: Wrap | None = None,
) -> StreamListener:
    url = _tcp_name((host, port))
    tracker = ConnectionTracker(f"listener {url}")
    ctx = tls.server_context() if tls is not None else None
    cb = _acceptor(
        tracker, handler, timeouts, lambda w: _tcp_name(w.get_extra_info("peername")), sock_buffer, wrap
    )
    try:
        server = await asyncio.start_server(
            cb,  # type: ignore[arg-type]
            host,
            port,
            limit=READ_BUFFER_LIMIT,
            ssl=ctx,
            ssl_handshake_timeout=timeouts.handshake if ctx is not None else None,
        )
    except OSError as exc:
        raise TransportError(f"cannot listen on {url}: {exc.strerror or exc}", url=url) from None
    address = server.sockets[0].getsockname()
    return StreamListener(server, _tcp_name(address), address, tracker, timeouts)


async def listen_unix(
    path: str,
    handler: Handler,
    *,
    tls: TLSConfig | None = None,
    timeouts: Timeouts = DEFAULT_TIMEOUTS,
    wrap: Wrap | None = None,
) -> StreamListener:
    url = f"unix://{path}"
    lock = _lock_unix_path(path, url)  # before anything touches the path: never unlink a live socket
    tracker = ConnectionTracker(f"listener {url}")
    ctx = tls.server_context() if tls is not None else None
    counter = iter(range(1, 1 << 62))
    cb = _acceptor(tracker, handler, timeouts, lambda w: f"{url}#{next(counter)}", None, wrap)
    try:
        server = await asyncio.start_unix_server(
            cb,  # type: ignore[arg-type]
            path,
            limit=READ_BUFFER_LIMIT,
            ssl=ctx,
            ssl_handshake_timeout=timeouts.handshake if ctx is not None else None,
        )
    except OSError as exc:
        os.close(lock)
        raise TransportError(f"cannot listen on {url}: {exc.strerror or exc}", url=url) from None
    return StreamListener(server, url, path, tracker, timeouts, unix_path=path, unix_lock=lock)


def _lock_unix_path(path: str, url: str) -> int:
    """Take ``path + ".lock"`` (an exclusive flock held while listening), so a second process started by
    mistake with the same socket path stops with a clear error instead of replacing the socket file of
    the one that is running (asyncio removes an existing socket file before binding). The lock file stays
    behind on purpose: removing it would let two processes lock two different files."""
    import fcntl

    lock_path = f"{path}.lock"
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise TransportError(f"cannot listen on {url}: {lock_path}: {exc.strerror or exc}", url=url) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise TransportError(
            f"cannot listen on {url}: another process is listening there (it holds {lock_path}); "
            "stop it first, or give this one another path",
            url=url,
        ) from None
    return fd
