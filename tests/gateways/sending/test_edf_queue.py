"""Properties of the chunked EDF / FIFO send queue, checked against a plain reference model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateways.config import EdfConfig
from gateways.sending.edf_queue import Chunk, EdfQueue, FifoQueue, SendQueue, make_send_queue
from sims.models.edf_link import run_pipeline, vgg_like_layers
from wanrt.errors import LocalProtocolError

Op = tuple[Any, ...]


@dataclass
class Ref:
    """What the queue should hold: items in push order with their priority and unsent byte count."""

    # item id -> (priority, push sequence number, the message bytes)
    items: dict[int, tuple[tuple[int, int], int, bytes]] = field(default_factory=dict)
    received: dict[int, bytearray] = field(default_factory=dict)
    seq: int = 0


def _message(sizes: list[int], salt: int) -> list[bytes]:
    rng = np.random.default_rng(salt)
    return [rng.integers(0, 256, size=n, dtype=np.uint8).tobytes() for n in sizes]


# messages of 1..MAX_MESSAGE bytes (an empty frame does not exist on the wire)
part_sizes = st.lists(st.integers(0, 40), min_size=1, max_size=4).filter(lambda sizes: sum(sizes) > 0)
MAX_MESSAGE = 160
ops = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(0, 3), st.integers(0, 5), part_sizes),
        st.tuples(st.just("next"), st.integers(1, 4)),
        st.tuples(
            st.just("drop_peer"),
        ),
    ),
    max_size=40,
)


def _check_chunk(ref: Ref, chunk: Chunk, chunk_bytes: int) -> None:
    """Bytes arrive exactly once, in order within the item, within the chunk size, last flag right."""
    data = ref.items[chunk.item_id][2]
    got = ref.received.setdefault(chunk.item_id, bytearray())
    assert chunk.offset == len(got)
    assert chunk.total == len(data)
    assert 0 < len(chunk.data) <= chunk_bytes
    got += chunk.data
    assert bytes(got) == data[: len(got)]
    assert chunk.last == (len(got) == len(data))
    if chunk.last:
        del ref.items[chunk.item_id]


def _started(ref: Ref) -> list[int]:
    """Items the peer is reassembling: partly sent, not finished, not cancelled."""
    return [i for i in ref.items if ref.received.get(i)]


def _check_choice(ref: Ref, chunk: Chunk, q: SendQueue, fifo: bool) -> None:
    """The chunk's item is the most urgent present (EDF) / oldest (FIFO), unless that one was refused
    because starting it would break the receiver's partial-item limits."""

    def key(i: int) -> tuple[int, ...]:
        prio, seq, _ = ref.items[i]
        return (seq,) if fifo else (*prio, seq)

    started = _started(ref)
    for i in ref.items:
        if key(i) < key(chunk.item_id):  # skipped over: only allowed for an item that may not start
            assert i not in started
            total = len(ref.items[i][2])
            full = len(started) >= q.max_partial_items
            over = sum(len(ref.items[j][2]) for j in started) + total > q.max_partial_bytes
            assert full or over


def _run(queue: SendQueue, operations: list[Op], fifo: bool) -> Ref:
    ref = Ref()
    next_id = 0

    def take() -> Chunk | None:
        chunk = queue.next_chunk("b")
        if not ref.items:
            assert chunk is None
            return None
        assert chunk is not None
        _check_choice(ref, chunk, queue, fifo)
        _check_chunk(ref, chunk, queue.chunk_bytes)
        started = _started(ref)
        assert len(started) <= queue.max_partial_items
        assert sum(len(ref.items[j][2]) for j in started) <= queue.max_partial_bytes
        return chunk

    for op in operations:
        if op[0] == "push":
            _, it, layer, sizes = op
            parts = _message(sizes, next_id)
            queue.push(next_id, "b", (it, layer), parts)
            ref.seq += 1
            ref.items[next_id] = ((it, layer), ref.seq, b"".join(parts))
            next_id += 1
        elif op[0] == "next":
            for _ in range(op[1]):
                if take() is None:
                    break
        else:  # the peer was lost: its backlog goes, the bytes already sent are reported per item
            sent = queue.cancel_peer("b")
            assert sent == {i: len(ref.received.get(i, b"")) for i in ref.items}
            ref.items.clear()
        stats = queue.stats().peers.get("b")
        if stats is not None:
            assert stats.queued_items == len(ref.items)
            assert stats.partial_items == len(_started(ref))
            unsent = sum(len(d) - len(ref.received.get(i, b"")) for i, (_, _, d) in ref.items.items())
            assert stats.queued_bytes == unsent
    while take() is not None:  # drain: everything left comes out exactly once
        pass
    assert ref.items == {}
    assert len(queue) == 0
    return ref


limits = st.tuples(st.integers(1, 16), st.integers(0, 16), st.integers(1, 3), st.integers(0, 100))


def _queue(cls: type[SendQueue], lim: tuple[int, int, int, int]) -> SendQueue:
    chunk, coalesce, max_items, extra_bytes = lim
    return cls(
        chunk_bytes=chunk,
        coalesce_bytes=min(coalesce, chunk),
        max_partial_items=max_items,
        max_item_bytes=MAX_MESSAGE,
        max_partial_bytes=MAX_MESSAGE + extra_bytes,
    )


@settings(max_examples=200, deadline=None)
@given(operations=ops, lim=limits)
def test_edf_order_and_bytes_exactly_once(operations: list[Op], lim: tuple[int, int, int, int]) -> None:
    _run(_queue(EdfQueue, lim), operations, fifo=False)


@settings(max_examples=100, deadline=None)
@given(operations=ops, lim=limits)
def test_fifo_order_and_bytes_exactly_once(operations: list[Op], lim: tuple[int, int, int, int]) -> None:
    _run(_queue(FifoQueue, lim), operations, fifo=True)


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 5000), min_size=1, max_size=6),
    sent_before=st.integers(0, 20),
    layer=st.integers(0, 3),
)
def test_urgent_item_waits_at_most_one_chunk(sizes: list[int], sent_before: int, layer: int) -> None:
    q = EdfQueue(chunk_bytes=1024, coalesce_bytes=64)
    for i, n in enumerate(sizes):
        q.push(i, "b", (5, 10 + i), [b"x" * n])
    for _ in range(sent_before):
        q.next_chunk("b")
    q.push(99, "b", (5, layer), [b"u" * 3000])
    chunk = q.next_chunk("b")
    assert chunk is not None and chunk.item_id == 99
    # and an older iteration beats any layer of a newer one
    q.push(100, "b", (4, 50), [b"o"])
    chunk = q.next_chunk("b")
    assert chunk is not None and chunk.item_id == 100


def test_fifo_ignores_priority_and_never_interleaves() -> None:
    q = FifoQueue(chunk_bytes=4, coalesce_bytes=0)
    q.push(1, "b", (9, 9), [b"aaaaaaaaaa"])
    q.next_chunk("b")
    q.push(2, "b", (0, 0), [b"bbbb"])
    order = []
    while (c := q.next_chunk("b")) is not None:
        order.append(c.item_id)
    assert order == [1, 1, 2]


def test_chunks_are_zero_copy_slices_of_large_parts() -> None:
    header = b"h" * 10
    values = np.arange(10_000, dtype=np.float32)
    q = EdfQueue(chunk_bytes=4096, coalesce_bytes=64)
    q.push(7, "b", (0, 0), [header, values.data.cast("B")])
    first = q.next_chunk("b")
    assert first is not None and bytes(first.data) == header  # small header alone: next part is large
    second = q.next_chunk("b")
    assert second is not None and len(second.data) == 4096
    assert np.shares_memory(np.frombuffer(second.data, dtype=np.uint8), values)


def test_small_parts_are_coalesced_into_one_chunk() -> None:
    q = EdfQueue(chunk_bytes=1024, coalesce_bytes=256)
    q.push(1, "b", (0, 0), [b"a" * 10, b"b" * 20, b"c" * 30])
    chunk = q.next_chunk("b")
    assert chunk is not None and chunk.last and bytes(chunk.data) == b"a" * 10 + b"b" * 20 + b"c" * 30
    assert q.next_chunk("b") is None


def test_empty_or_oversized_message_is_refused() -> None:
    q = EdfQueue(chunk_bytes=8, coalesce_bytes=0, max_item_bytes=10, max_partial_bytes=10)
    with pytest.raises(LocalProtocolError):
        q.push(3, "b", (0, 0), [b"", b""])
    with pytest.raises(LocalProtocolError):
        q.push(4, "b", (0, 0), [b"x" * 11])
    q.push(5, "b", (0, 0), [b"x" * 10])


def test_links_are_independent_and_dropping_a_peer_keeps_the_others() -> None:
    q = EdfQueue(chunk_bytes=4, coalesce_bytes=0)
    for peer in ("b", "c"):
        q.push(1, peer, (0, 1), [b"12345678"])
        q.push(2, peer, (0, 2), [b"zz"])
    assert q.next_chunk("b") == Chunk(1, 0, 8, memoryview(b"1234"))
    assert q.cancel_peer("b") == {1: 4, 2: 0}
    assert q.next_chunk("c") == Chunk(1, 0, 8, memoryview(b"1234"))
    assert q.next_chunk("c") == Chunk(1, 4, 8, memoryview(b"5678"))
    assert q.next_chunk("c") == Chunk(2, 0, 2, memoryview(b"zz"))
    assert q.next_chunk("b") is None and q.next_chunk("nobody") is None
    stats = q.stats()
    assert stats.peers["b"].cancelled_items == 2 and stats.peers["c"].sent_items == 2
    assert stats.queued_bytes == 0 and stats.sent_bytes == 4 + 8 + 2


def test_cancel_peer_drops_a_long_backlog() -> None:
    q = EdfQueue(chunk_bytes=4, coalesce_bytes=0)
    for i in range(200):
        q.push(i, "b", (0, i), [b"abcdefgh"])
    q.next_chunk("b")
    assert q.cancel_peer("b") == {0: 4, **{i: 0 for i in range(1, 200)}}
    assert q.cancel_peer("b") == {} and q.cancel_peer("nobody") == {}
    stats = q.stats().peers["b"]
    assert stats.queued_items == 0 and stats.partial_items == 0 and stats.queued_bytes == 0
    assert not q.pending("b") and q.next_chunk("b") is None and len(q) == 0
    q.push(0, "b", (1, 0), [b"new"])  # the ids are free again for a reconnected peer
    assert q.next_chunk("b") == Chunk(0, 0, 3, memoryview(b"new"))


def test_head_priority_in_stats() -> None:
    q = EdfQueue()
    q.push(1, "b", (3, 4), [b"x"])
    q.push(2, "b", (3, 1), [b"x"])
    assert q.stats().peers["b"].head == (3, 1)


@pytest.mark.parametrize(
    ("item_id", "peer", "priority"),
    [(-1, "b", (0, 0)), (1, "", (0, 0)), (1, "b", (0, -1)), (1, "b", (0,)), (True, "b", (0, 0))],
)
def test_bad_push_is_a_local_error(item_id: int, peer: str, priority: tuple[int, int]) -> None:
    with pytest.raises(LocalProtocolError):
        EdfQueue().push(item_id, peer, priority, [b"x"])


def test_duplicate_and_non_contiguous_push_rejected() -> None:
    q = EdfQueue()
    q.push(1, "b", (0, 0), [b"x"])
    with pytest.raises(LocalProtocolError):
        q.push(1, "b", (0, 1), [b"y"])
    q.push(1, "c", (0, 0), [b"x"])  # same id on another link is fine
    strided = np.arange(10, dtype=np.float32)[::2].data
    with pytest.raises(LocalProtocolError):
        q.push(2, "b", (0, 0), [strided])


def test_typed_parts_are_sent_as_raw_bytes() -> None:
    values = np.arange(5, dtype=np.float32)
    q = EdfQueue(chunk_bytes=1 << 10, coalesce_bytes=0)
    q.push(1, "b", (0, 0), [values.data])
    chunk = q.next_chunk("b")
    assert chunk is not None and bytes(chunk.data) == values.tobytes()


def test_make_send_queue_follows_config() -> None:
    assert isinstance(make_send_queue(EdfConfig()), EdfQueue)
    q = make_send_queue(EdfConfig(policy="fifo", chunk_bytes=1024, coalesce_bytes=0))
    assert isinstance(q, FifoQueue) and q.chunk_bytes == 1024
    with pytest.raises(LocalProtocolError):
        EdfQueue(chunk_bytes=0)
    with pytest.raises(LocalProtocolError):
        EdfQueue(chunk_bytes=4, coalesce_bytes=5)


def test_preemption_never_opens_more_partial_items_than_the_peer_accepts() -> None:
    q = EdfQueue(chunk_bytes=4, coalesce_bytes=0, max_partial_items=2)
    q.push(1, "b", (0, 5), [b"a" * 10])
    assert q.next_chunk("b") == Chunk(1, 0, 10, memoryview(b"aaaa"))
    q.push(2, "b", (0, 4), [b"b" * 10])
    assert q.next_chunk("b") == Chunk(2, 0, 10, memoryview(b"bbbb"))
    q.push(3, "b", (0, 3), [b"c" * 10])  # more urgent, but a third partial item: waits
    q.push(4, "b", (0, 0), [b"ddd"])  # fits in one chunk: needs no reassembly, may go
    ids = []
    while (c := q.next_chunk("b")) is not None:
        ids.append(c.item_id)
        assert q.stats().peers["b"].partial_items <= 2
    assert ids == [4, 2, 2, 3, 3, 3, 1, 1]


def test_byte_budget_of_partial_items_is_respected() -> None:
    q = EdfQueue(chunk_bytes=4, coalesce_bytes=0, max_item_bytes=10, max_partial_bytes=15)
    q.push(1, "b", (0, 5), [b"a" * 10])
    q.next_chunk("b")
    q.push(2, "b", (0, 0), [b"b" * 10])  # 10 + 10 > 15: cannot start until item 1 is done
    ids = [c.item_id for c in iter(lambda: q.next_chunk("b"), None)]
    assert ids == [1, 1, 2, 2, 2]


def test_pipeline_model_edf_ships_the_first_layer_within_one_chunk_and_beats_fifo() -> None:
    sizes = vgg_like_layers(8, total_bytes=1 << 20)
    rate, chunk = 1e6, 4096  # bytes/s: the transfer takes ~1 s
    kw = {"rate_bytes_s": rate, "backward_s": 0.5, "forward_s": 0.3}
    edf = run_pipeline(EdfQueue(chunk_bytes=chunk, coalesce_bytes=0), sizes, **kw)
    fifo = run_pipeline(FifoQueue(chunk_bytes=chunk, coalesce_bytes=0), sizes, **kw)
    pushed = 0.5  # layer 0's gradient is the last one the backward pass produces
    assert edf.arrival_s[0] <= pushed + (chunk + sizes[0]) / rate + 1e-9
    assert fifo.arrival_s[0] == pytest.approx(max(fifo.arrival_s))  # FIFO ships it last
    assert edf.forward_end_s < fifo.forward_end_s
    # same bytes on the same link: the last byte leaves at the same time, only the order differs
    assert max(edf.arrival_s) == pytest.approx(max(fifo.arrival_s))
