"""The gateway's send queue: which bytes go next on each WAN link (sans-IO; the daemon pulls chunks).

Why EDF. StellaTrain §3.3 ("Priority-based task scheduling", seed 004) observes that a first-come order
sends the last layers' gradients first — they come out of the backward pass first — while the next
iteration's forward pass needs the *first* layers first, so the GPUs stall on the tail of the transfer.
It schedules by Earliest Deadline First with priority to earlier iterations, then to layers nearer the
input, and lets a running lower-priority task finish without pre-emption. Here the priority key is
``(iteration, layer)`` with layer 0 = the first layer of the forward pass; smaller is more urgent.

Why chunks. A WAN transfer of one large layer can take seconds; without pre-emption an urgent layer
enqueued meanwhile would wait for all of it. Messages are therefore cut into chunks of ``chunk_bytes``
and the queue is non-preemptive only at chunk granularity: an item that becomes the most urgent is sent
from the very next chunk on, so it waits behind at most the one chunk already on the wire. Equal keys keep
push order, so an item in progress is not interleaved with a later one of the same priority.

Why one object with per-peer sub-queues. Each link drains at its own pace (its sender pulls with
:meth:`SendQueue.next_chunk`), so ordering is per link; but dropping a lost peer's backlog and the /metrics
totals need one index over all links, and a gateway often sends one aggregate to several peers under the
same item id.

Receiver limits. The peer reassembles an item that spans several chunks in a buffer of its full size and
refuses more than ``MAX_PARTIAL_ITEMS`` such items, or ``MAX_REASSEMBLY_BYTES`` of them, per connection
(:mod:`wanrt.protocol.limits`). Pre-empting at every chunk could open an item per urgency level, so an
item that would need reassembly only *starts* while the link is under both limits; otherwise the most
urgent item among those already started (or fitting in one chunk) goes next. EDF holds among the items
that may be sent without breaking the peer's limits.

Zero copy. Parts are kept as ``memoryview``s of the caller's buffers (``Connection.send_parts`` output) and
a chunk is a slice of one part. Only pieces shorter than ``coalesce_bytes`` (message headers, tiny layers)
are copied together into one chunk, so small messages do not pay a frame per part.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

from gateways.sending.config import EdfConfig
from wanrt.errors import LocalProtocolError
from wanrt.protocol.limits import MAX_COUNTER, MAX_FRAME_BYTES, MAX_PARTIAL_ITEMS, MAX_REASSEMBLY_BYTES

__all__ = [
    "Chunk",
    "EdfQueue",
    "FifoQueue",
    "PeerQueueStats",
    "Priority",
    "QueueStats",
    "SendQueue",
    "make_send_queue",
]

#: (iteration, layer): smaller is more urgent; layer 0 is the first layer of the forward pass.
Priority: TypeAlias = tuple[int, int]
BytesLike: TypeAlias = bytes | bytearray | memoryview

# Lazily deleted (cancelled) heap entries are purged once they outnumber live ones by this much, so a
# gateway that cancels a lot does not keep dead entries (and their buffers) around.
_PURGE_MIN_DEAD = 64


@dataclass(frozen=True, slots=True)
class Chunk:
    """One slice of a queued message: exactly the fields of the wire protocol's ``Chunk`` message."""

    item_id: int
    offset: int
    total: int
    data: memoryview

    @property
    def last(self) -> bool:
        """True for the chunk that completes the item (the receiver can hand the message on)."""
        return self.offset + len(self.data) == self.total


@dataclass(frozen=True, slots=True)
class PeerQueueStats:
    """Queue depth and progress of one link, for /metrics."""

    queued_items: int
    queued_bytes: int
    partial_items: int
    sent_items: int
    sent_chunks: int
    sent_bytes: int
    cancelled_items: int
    head: Priority | None


@dataclass(frozen=True, slots=True)
class QueueStats:
    peers: Mapping[str, PeerQueueStats]

    @property
    def queued_items(self) -> int:
        return sum(s.queued_items for s in self.peers.values())

    @property
    def queued_bytes(self) -> int:
        return sum(s.queued_bytes for s in self.peers.values())

    @property
    def sent_bytes(self) -> int:
        return sum(s.sent_bytes for s in self.peers.values())


class _Item:
    __slots__ = ("dead", "item_id", "off", "part", "parts", "peer", "priority", "sent", "total")

    def __init__(self, item_id: int, peer: str, priority: Priority, parts: list[memoryview]) -> None:
        self.item_id = item_id
        self.peer = peer
        self.priority = priority
        self.parts = parts
        self.total = sum(len(p) for p in parts)
        self.sent = 0
        self.part = 0  # index of the part the next chunk starts in
        self.off = 0  # byte offset inside that part
        self.dead = False


class _Link:
    """The sub-queue and counters of one peer link."""

    __slots__ = (
        "cancelled_items",
        "dead",
        "heap",
        "partial_bytes",
        "partial_items",
        "queued_bytes",
        "sent_bytes",
        "sent_chunks",
        "sent_items",
    )

    def __init__(self) -> None:
        self.heap: list[tuple[tuple[int, ...], _Item]] = []
        self.dead = 0  # heap entries of cancelled or finished-out-of-order items, purged lazily
        self.partial_items = 0  # started, unfinished items the peer is reassembling
        self.partial_bytes = 0
        self.queued_bytes = 0
        self.sent_items = 0
        self.sent_chunks = 0
        self.sent_bytes = 0
        self.cancelled_items = 0

    def live(self) -> int:
        return len(self.heap) - self.dead


def _as_bytes_view(part: BytesLike) -> memoryview:
    view = part if isinstance(part, memoryview) else memoryview(part)
    if view.format == "B" and view.ndim == 1:
        return view
    try:
        return view.cast("B")
    except TypeError as exc:
        raise LocalProtocolError(f"message part is not a contiguous buffer: {exc}") from None


class SendQueue:
    """Per-peer chunked send queues; the order among items is given by :meth:`_key` (EDF or FIFO)."""

    policy: Literal["edf", "fifo"] = "edf"

    def __init__(
        self,
        *,
        chunk_bytes: int = 256 << 10,
        coalesce_bytes: int = 4 << 10,
        max_partial_items: int = MAX_PARTIAL_ITEMS,
        max_partial_bytes: int = MAX_REASSEMBLY_BYTES,
        max_item_bytes: int = MAX_FRAME_BYTES,
    ) -> None:
        if chunk_bytes < 1:
            raise LocalProtocolError("chunk_bytes must be >= 1", value=chunk_bytes)
        if not 0 <= coalesce_bytes <= chunk_bytes:
            raise LocalProtocolError("coalesce_bytes must be in 0..chunk_bytes", value=coalesce_bytes)
        if max_partial_items < 1 or not 1 <= max_item_bytes <= max_partial_bytes:
            raise LocalProtocolError(
                "need max_partial_items >= 1 and 1 <= max_item_bytes <= max_partial_bytes",
                value=(max_partial_items, max_item_bytes, max_partial_bytes),
            )
        self.chunk_bytes = chunk_bytes
        self.coalesce_bytes = coalesce_bytes
        self.max_partial_items = max_partial_items
        self.max_partial_bytes = max_partial_bytes
        self.max_item_bytes = max_item_bytes
        self._links: dict[str, _Link] = {}
        self._items: dict[tuple[int, str], _Item] = {}
        self._seq = 0

    def _key(self, priority: Priority, seq: int) -> tuple[int, ...]:
        return (priority[0], priority[1], seq)

    # -- producer side -------------------------------------------------------------------------------

    def push(self, item_id: int, peer: str, priority: Priority, parts: Sequence[BytesLike]) -> None:
        """Queue one message (``parts`` concatenated) for ``peer``; the buffers are referenced, not copied.

        The caller must not modify the buffers until the item is sent or cancelled.
        """
        if type(item_id) is not int or not 0 <= item_id <= MAX_COUNTER:
            raise LocalProtocolError("item_id must be an int in 0..MAX_COUNTER", value=item_id)
        if not isinstance(peer, str) or not peer:
            raise LocalProtocolError("peer must be a non-empty site name", value=peer)
        if (
            len(priority) != 2
            or any(type(p) is not int for p in priority)
            or priority[0] < 0
            or priority[1] < 0
        ):
            raise LocalProtocolError("priority must be (iteration >= 0, layer >= 0)", value=priority)
        if (item_id, peer) in self._items:
            raise LocalProtocolError("item already queued for this peer", peer=peer, value=item_id)
        views = [v for v in (_as_bytes_view(p) for p in parts) if len(v)]
        item = _Item(item_id, peer, (priority[0], priority[1]), views)
        if not 1 <= item.total <= self.max_item_bytes:
            raise LocalProtocolError(
                "message must hold 1..max_item_bytes bytes",
                peer=peer,
                value=item.total,
                limit=self.max_item_bytes,
            )
        link = self._links.get(peer)
        if link is None:
            link = self._links[peer] = _Link()
        self._seq += 1
        heapq.heappush(link.heap, (self._key(item.priority, self._seq), item))
        link.queued_bytes += item.total
        self._items[(item_id, peer)] = item

    def cancel_peer(self, peer: str) -> dict[int, int]:
        """Drop everything queued for a lost peer; returns item id -> bytes already sent."""
        link = self._links.get(peer)
        if link is None:
            return {}
        done = {item.item_id: item.sent for _, item in link.heap if not item.dead}
        for item_id in done:
            self._kill(self._items.pop((item_id, peer)))
        return done

    def _kill(self, item: _Item) -> None:
        link = self._links[item.peer]
        link.cancelled_items += 1
        link.queued_bytes -= item.total - item.sent
        if item.sent:
            link.partial_items -= 1
            link.partial_bytes -= item.total
        self._bury(link, item)

    def _bury(self, link: _Link, item: _Item) -> None:
        """Lazily delete an item that is not (necessarily) at the top of its heap."""
        item.dead = True
        link.dead += 1
        item.parts = []  # release the caller's buffers now, not when the entry reaches the heap top
        if link.dead >= _PURGE_MIN_DEAD and link.dead > link.live():
            link.heap = [e for e in link.heap if not e[1].dead]
            heapq.heapify(link.heap)
            link.dead = 0

    # -- link side -----------------------------------------------------------------------------------

    def next_chunk(self, peer: str) -> Chunk | None:
        """The next chunk to put on ``peer``'s link, or None when nothing is queued for it."""
        link = self._links.get(peer)
        if link is None:
            return None
        heap = link.heap
        while heap and heap[0][1].dead:
            heapq.heappop(heap)
            link.dead -= 1
        if not heap:
            return None
        item = heap[0][1]
        pieces, part, off = self._plan(item)
        if not self._may_send(link, item, pieces):
            item, pieces, part, off = self._most_urgent_sendable(link)
        data = pieces[0] if len(pieces) == 1 else memoryview(b"".join(pieces))
        chunk = Chunk(item.item_id, item.sent, item.total, data)
        if item.sent == 0 and len(data) < item.total:
            link.partial_items += 1
            link.partial_bytes += item.total
        item.sent += len(data)
        item.part, item.off = part, off
        link.queued_bytes -= len(data)
        link.sent_bytes += len(data)
        link.sent_chunks += 1
        if item.sent == item.total:
            if chunk.offset:
                link.partial_items -= 1
                link.partial_bytes -= item.total
            del self._items[(item.item_id, peer)]
            link.sent_items += 1
            if heap[0][1] is item:
                heapq.heappop(heap)
            else:
                self._bury(link, item)
        return chunk

    def _may_send(self, link: _Link, item: _Item, pieces: list[memoryview]) -> bool:
        """False if starting ``item`` would open one reassembly too many at the peer."""
        if item.sent or sum(len(p) for p in pieces) == item.total:
            return True
        return (
            link.partial_items < self.max_partial_items
            and link.partial_bytes + item.total <= self.max_partial_bytes
        )

    def _most_urgent_sendable(self, link: _Link) -> tuple[_Item, list[memoryview], int, int]:
        """Slow path when the heap top may not start: scan for the best item that may go.

        One always exists: the top is refused only while some item is partially sent (every item fits the
        byte budget alone), and a started item may always continue.
        """
        best: tuple[tuple[int, ...], _Item, list[memoryview], int, int] | None = None
        for key, item in link.heap:
            if item.dead or (best is not None and key >= best[0]):
                continue
            pieces, part, off = self._plan(item)
            if self._may_send(link, item, pieces):
                best = (key, item, pieces, part, off)
        assert best is not None, "a partially sent item always exists when the heap top is refused"
        return best[1], best[2], best[3], best[4]

    def _plan(self, item: _Item) -> tuple[list[memoryview], int, int]:
        """The pieces of the item's next chunk and where its cursor (part, offset) would move."""
        parts = item.parts
        part = parts[item.part]
        rest = len(part) - item.off
        if rest >= self.coalesce_bytes or item.part == len(parts) - 1:
            n = min(self.chunk_bytes, rest)
            end = item.off + n
            if end == len(part):
                return [part[item.off : end]], item.part + 1, 0
            return [part[item.off : end]], item.part, end
        pieces = [part[item.off :]]
        size = rest
        j = item.part + 1
        while (
            j < len(parts)
            and len(parts[j]) < self.coalesce_bytes
            and size + len(parts[j]) <= self.chunk_bytes
        ):
            pieces.append(parts[j])
            size += len(parts[j])
            j += 1
        return pieces, j, 0

    # -- introspection -------------------------------------------------------------------------------

    def pending(self, peer: str) -> bool:
        link = self._links.get(peer)
        return link is not None and link.live() > 0

    def __len__(self) -> int:
        return len(self._items)

    def stats(self) -> QueueStats:
        out: dict[str, PeerQueueStats] = {}
        for peer, link in self._links.items():
            live = [e for e in link.heap if not e[1].dead]
            head = min(live, key=lambda e: e[0])[1].priority if live else None
            out[peer] = PeerQueueStats(
                queued_items=len(live),
                queued_bytes=link.queued_bytes,
                partial_items=link.partial_items,
                sent_items=link.sent_items,
                sent_chunks=link.sent_chunks,
                sent_bytes=link.sent_bytes,
                cancelled_items=link.cancelled_items,
                head=head,
            )
        return QueueStats(out)


class EdfQueue(SendQueue):
    """Earliest deadline first: smallest (iteration, layer), ties in push order (StellaTrain §3.3)."""

    policy = "edf"


class FifoQueue(SendQueue):
    """First come, first served per link, ignoring priorities: the baseline EDF is measured against."""

    policy = "fifo"

    def _key(self, priority: Priority, seq: int) -> tuple[int, ...]:
        return (seq,)


def make_send_queue(
    cfg: EdfConfig,
    *,
    max_partial_items: int = MAX_PARTIAL_ITEMS,
    max_partial_bytes: int = MAX_REASSEMBLY_BYTES,
    max_item_bytes: int = MAX_FRAME_BYTES,
) -> SendQueue:
    """The queue ``[gateway.edf] policy`` asks for; pass lower receiver limits if the connection has them."""
    cls = EdfQueue if cfg.policy == "edf" else FifoQueue
    return cls(
        chunk_bytes=cfg.chunk_bytes,
        coalesce_bytes=cfg.coalesce_bytes,
        max_partial_items=max_partial_items,
        max_partial_bytes=max_partial_bytes,
        max_item_bytes=max_item_bytes,
    )
