"""A WAN link emulated in user space: token-bucket rate, one-way delay and jitter around any transport.

Why in user space: the demo and the tests must run without root (no ``tc netem``/``tbf``), and the
scheduler's bandwidth adaptation needs a link whose rate can be changed at run time from a trace
(:mod:`transports.traces`). The model is one direction of a router port: a bounded bottleneck queue
(``shape.queue`` bytes; full → ``send`` blocks, i.e. back-pressure, never a drop), a token bucket that
releases ``shape.chunk``-sized pieces at ``rate_bps`` (small chunks so :meth:`set_rate` bites within one
chunk), then a propagation line that hands each piece to the inner transport ``delay ± jitter`` later
(uniform jitter; order is preserved, so jitter never reorders bytes of a stream).

Bytes inside the shaper are bounded: the queue holds ≤ ``shape.queue`` (+ one chunk), the propagation line
≤ rate × (delay + jitter) + burst, and because the single writer task stops releasing while the inner
transport is blocked, a stalled receiver holds at most one more queue's worth in the batch being handed
over (so ≤ 2 × queue + rate × (delay + jitter) + burst in all).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import random
import time
from collections.abc import Callable, Sequence

from transports.base import Transport, as_byte_views
from transports.link import DEFAULT_SHAPE, LinkShape
from transports.timeouts import DEFAULT_TIMEOUTS, Timeouts, deadline
from transports.token_bucket import TokenBucket
from wanrt.config import check
from wanrt.errors import PeerLost, TransportError

__all__ = ["ShapedTransport"]


class ShapedTransport:
    """Shapes the *outgoing* bytes of ``inner``; ``recv`` passes through (shape both ends for both ways).

    ``clock`` must be the clock the event loop sleeps on (monotonic seconds); it is injectable so the
    pacing arithmetic can be checked against the same time base the token bucket uses.
    """

    def __init__(
        self,
        inner: Transport,
        shape: LinkShape = DEFAULT_SHAPE,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        timeouts: Timeouts = DEFAULT_TIMEOUTS,
    ) -> None:
        self.peer = inner.peer
        self.shape = shape
        self._inner = inner
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()
        self._timeouts = timeouts
        self._delay = shape.delay_s
        self._jitter = shape.jitter_s
        self._bucket = TokenBucket(shape.rate_bps, shape.burst_for(shape.rate_bps), clock())
        self._pending: collections.deque[bytes] = collections.deque()
        self._pending_bytes = 0
        self._held: bytes | None = None  # reserved in the bucket, waiting for its release time
        self._line: collections.deque[tuple[float, bytes]] = collections.deque()
        self._line_bytes = 0
        self._last_delivery = -math.inf
        self._delivered = 0
        self._sending = 0  # bytes of the batch the writer is handing to the inner transport right now
        self._wake = asyncio.Event()
        self._space = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._send_lock = asyncio.Lock()
        self._writer: asyncio.Task[None] | None = None
        self._error: BaseException | None = None
        self._closing = False
        self._closed = False

    # -- the Transport interface -------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed or self._inner.closed

    @property
    def inner(self) -> Transport:
        return self._inner

    async def send(self, parts: Sequence[bytes | memoryview]) -> None:
        """Queue ``parts`` (copied) for the link; blocks while the bottleneck queue is full."""
        if self._closing or self._closed:
            raise TransportError("send on a closed transport", peer=self.peer)
        self._raise_if_failed()
        views = as_byte_views(parts)
        async with self._send_lock:
            try:
                await deadline(self._admit(views), self._timeouts.send, "send", self.peer)
            except BaseException as exc:
                if not isinstance(exc, TransportError):
                    self.abort()  # part of a message is queued: the stream cannot be resumed
                raise

    async def recv(self, max_bytes: int = 1 << 20) -> bytes:
        return await self._inner.recv(max_bytes)

    async def close(self) -> None:
        """Deliver what is queued (under ``timeouts.close``), then close the inner transport."""
        if self._closed:
            return
        self._closing = True
        self._wake.set()
        writer = self._writer
        try:
            if writer is not None and not writer.done():
                await asyncio.wait({writer}, timeout=self._timeouts.close)
        except asyncio.CancelledError:
            self.abort()  # cancelled while flushing: the inner transport must not be left open
            raise
        finally:
            if writer is not None and not writer.done():
                writer.cancel()
                await asyncio.gather(writer, return_exceptions=True)
            self._closed = True
            self._space.set()
        await self._inner.close()

    def abort(self) -> None:
        """Drop everything in flight and abort the inner transport (if it can abort)."""
        self._closing = self._closed = True
        if self._writer is not None:
            self._writer.cancel()
        self._pending.clear()
        self._line.clear()
        self._held = None
        self._pending_bytes = self._line_bytes = 0
        self._space.set()
        self._idle.set()
        abort = getattr(self._inner, "abort", None)
        if callable(abort):
            abort()

    # -- control ---------------------------------------------------------------------------------------

    @property
    def rate_bps(self) -> float:
        return self._bucket.rate_bps

    def set_rate(self, rate_bps: float) -> None:
        """Change the link rate now; the piece being paced is re-timed at the new rate."""
        self._bucket.set_rate(rate_bps, self._clock(), burst=self.shape.burst_for(rate_bps))
        self._wake.set()

    def set_delay(self, delay_s: float, jitter_s: float | None = None) -> None:
        """Change the one-way delay (and jitter) for pieces released from now on."""
        check(delay_s >= 0 and math.isfinite(delay_s), "delay_s", delay_s, "must be >= 0")
        jitter = self._jitter if jitter_s is None else jitter_s
        check(jitter >= 0 and math.isfinite(jitter), "jitter_s", jitter, "must be >= 0")
        self._delay, self._jitter = delay_s, jitter

    @property
    def bytes_in_flight(self) -> int:
        """Bytes accepted by ``send`` but not yet handed to the inner transport."""
        held = len(self._held) if self._held is not None else 0
        return self._pending_bytes + held + self._line_bytes + self._sending

    @property
    def bytes_delivered(self) -> int:
        return self._delivered

    async def flush(self) -> None:
        """Wait until everything sent so far has been handed to the inner transport."""
        while self.bytes_in_flight and self._error is None and not self._closed:
            self._idle.clear()
            await self._idle.wait()
        self._raise_if_failed()

    # -- internals -------------------------------------------------------------------------------------

    def _raise_if_failed(self) -> None:
        exc = self._error
        if exc is None:
            return
        cls = PeerLost if isinstance(exc, PeerLost) else TransportError
        raise cls(f"link to {self.peer} failed: {exc}", peer=self.peer)

    async def _admit(self, views: list[memoryview]) -> None:
        chunk = self.shape.chunk
        buf = bytearray()
        for mv in views:
            off, n = 0, len(mv)
            while off < n:
                take = min(chunk - len(buf), n - off)
                buf += mv[off : off + take]
                off += take
                if len(buf) == chunk:
                    await self._enqueue(bytes(buf))
                    buf.clear()
        if buf:
            await self._enqueue(bytes(buf))

    async def _enqueue(self, piece: bytes) -> None:
        while self._pending_bytes and self._pending_bytes + len(piece) > self.shape.queue:
            self._space.clear()
            await self._space.wait()
            self._raise_if_failed()
            if self._closing:
                raise TransportError("transport closed during send", peer=self.peer)
        self._pending.append(piece)
        self._pending_bytes += len(piece)
        self._idle.clear()
        self._wake.set()
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(self._run(), name=f"shaper {self.peer}")

    def _release(self, now: float) -> None:
        """Move pieces from the queue through the bucket onto the propagation line, as far as allowed."""
        while True:
            if self._held is None:
                if not self._pending:
                    return
                piece = self._pending.popleft()
                self._pending_bytes -= len(piece)
                self._space.set()
                self._bucket.reserve(len(piece), now)
                self._held = piece
            if self._bucket.ready_at(now) > now:
                return
            piece, self._held = self._held, None
            delay = self._delay
            if self._jitter:
                delay = max(0.0, delay + self._rng.uniform(-self._jitter, self._jitter))
            at = max(now + delay, self._last_delivery)
            self._last_delivery = at
            self._line.append((at, piece))
            self._line_bytes += len(piece)

    async def _run(self) -> None:
        try:
            while True:
                now = self._clock()
                self._release(now)
                due: list[bytes] = []
                while self._line and self._line[0][0] <= now:
                    piece = self._line.popleft()[1]
                    self._line_bytes -= len(piece)
                    due.append(piece)
                if due:
                    self._sending = sum(map(len, due))
                    await self._inner.send(due)
                    self._delivered += self._sending
                    self._sending = 0
                    continue
                if self._held is None and not self._line:
                    self._idle.set()
                    if self._closing:
                        return
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                wake_at = self._line[0][0] if self._line else math.inf
                if self._held is not None:
                    wake_at = min(wake_at, self._bucket.ready_at(now))
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.0, wake_at - now)):
                        await self._wake.wait()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._error = exc
            self._space.set()
            self._idle.set()
