"""Cutting an encoded frame into Chunk messages, and putting it back together on the other side.

Why: a gateway's earliest-deadline-first send queue (StellaTrain §3.3, "Priority-based task scheduling")
must not let a multi-second transfer of one big layer block an urgent early layer enqueued meanwhile. So a
large frame travels as Chunks of a few hundred KiB, interleaved with other items; the send queue is
non-preemptive only at chunk granularity.

Rules the receiver enforces (each violation is the peer's fault):

* the chunks of one item arrive in order (``offset`` equals the bytes received so far) and agree on
  ``total``; one TCP stream preserves order, so anything else is a bug or an attack;
* ``total`` is at most the frame limit, at most ``max_items`` items are partially reassembled at a time, and
  their announced totals sum to at most ``max_bytes``; each is checked *before* the item's buffer exists;
* a completed item is a whole frame, which the connection then decodes like any other (a Chunk inside a
  Chunk is refused there).
"""

from __future__ import annotations

from collections.abc import Sequence

from wanrt.errors import LimitExceeded, LocalProtocolError, RemoteProtocolError
from wanrt.protocol.limits import MAX_FRAME_BYTES, MAX_PARTIAL_ITEMS, MAX_REASSEMBLY_BYTES, MIN_CHUNK_BYTES
from wanrt.protocol.messages import Chunk

__all__ = ["Reassembler", "split_frame"]


def split_frame(parts: Sequence[bytes | memoryview], *, item_id: int, chunk_bytes: int) -> list[Chunk]:
    """Cut the parts of one encoded frame (``Connection.send_parts`` output) into Chunks of at most
    ``chunk_bytes``. Chunks inside one part are views of it; only a chunk straddling parts is copied."""
    if chunk_bytes < MIN_CHUNK_BYTES:
        raise LocalProtocolError(
            "chunk_bytes below MIN_CHUNK_BYTES", limit=MIN_CHUNK_BYTES, value=chunk_bytes
        )
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    total = sum(v.nbytes for v in views)
    if not 0 < total <= MAX_FRAME_BYTES:
        raise LocalProtocolError("frame to split must hold 1..MAX_FRAME_BYTES bytes", value=total)
    chunks: list[Chunk] = []
    offset = 0
    pending: list[memoryview] = []
    pending_len = 0
    for v in views:
        pos = 0
        while pos < v.nbytes:
            take = min(chunk_bytes - pending_len, v.nbytes - pos)
            pending.append(v[pos : pos + take])
            pending_len += take
            pos += take
            if pending_len == chunk_bytes:
                data = pending[0] if len(pending) == 1 else b"".join(pending)
                chunks.append(Chunk(item_id, offset, total, data))
                offset += pending_len
                pending, pending_len = [], 0
    if pending:
        data = pending[0] if len(pending) == 1 else b"".join(pending)
        chunks.append(Chunk(item_id, offset, total, data))
    return chunks


class _Partial:
    __slots__ = ("buf", "filled")

    def __init__(self, total: int) -> None:
        self.buf = bytearray(total)
        self.filled = 0


class Reassembler:
    """Sans-IO reassembly of chunked items on one connection, bounded in count and bytes."""

    def __init__(
        self,
        *,
        max_items: int = MAX_PARTIAL_ITEMS,
        max_item_bytes: int = MAX_FRAME_BYTES,
        max_bytes: int = MAX_REASSEMBLY_BYTES,
        peer: str | None = None,
    ) -> None:
        self.max_items = max_items
        self.max_item_bytes = max_item_bytes
        self.max_bytes = max_bytes
        self.peer = peer
        self._items: dict[int, _Partial] = {}
        self._reserved = 0

    @property
    def pending(self) -> int:
        """Items partially reassembled."""
        return len(self._items)

    @property
    def reserved_bytes(self) -> int:
        """Bytes allocated for partially reassembled items."""
        return self._reserved

    def add(self, chunk: Chunk) -> memoryview | None:
        """Take one chunk; return the item's complete bytes when this chunk finishes it."""
        n = memoryview(chunk.data).nbytes
        item = self._items.get(chunk.item_id)
        if item is None:
            if chunk.offset != 0:
                raise RemoteProtocolError(
                    "first chunk of an item must start at offset 0", peer=self.peer, value=chunk.offset
                )
            if chunk.total > self.max_item_bytes:
                raise LimitExceeded(
                    "chunked item larger than the frame limit",
                    name="max_frame_bytes",
                    limit=self.max_item_bytes,
                    value=chunk.total,
                    peer=self.peer,
                )
            if n == chunk.total:  # a single-chunk item needs no reassembly buffer
                return memoryview(chunk.data)
            if len(self._items) >= self.max_items:
                raise LimitExceeded(
                    "too many chunked items in flight",
                    name="MAX_PARTIAL_ITEMS",
                    limit=self.max_items,
                    value=len(self._items) + 1,
                    peer=self.peer,
                )
            if self._reserved + chunk.total > self.max_bytes:
                raise LimitExceeded(
                    "chunked items in flight exceed the reassembly budget",
                    name="MAX_REASSEMBLY_BYTES",
                    limit=self.max_bytes,
                    value=self._reserved + chunk.total,
                    peer=self.peer,
                )
            item = self._items[chunk.item_id] = _Partial(chunk.total)
            self._reserved += chunk.total
        elif chunk.total != len(item.buf) or chunk.offset != item.filled:
            raise RemoteProtocolError(
                "chunk out of order or inconsistent with its item",
                peer=self.peer,
                value=(chunk.item_id, chunk.offset, chunk.total),
                limit=(item.filled, len(item.buf)),
            )
        item.buf[item.filled : item.filled + n] = chunk.data
        item.filled += n
        if item.filled < len(item.buf):
            return None
        del self._items[chunk.item_id]
        self._reserved -= len(item.buf)
        return memoryview(item.buf)

    def cancel(self, item_id: int) -> bool:
        """Drop a partial item (the sender cancelled it); False if there was none."""
        item = self._items.pop(item_id, None)
        if item is None:
            return False
        self._reserved -= len(item.buf)
        return True

    def clear(self) -> None:
        self._items.clear()
        self._reserved = 0
