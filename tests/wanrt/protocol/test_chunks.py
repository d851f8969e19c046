"""Chunked items: splitting a frame, interleaved reassembly, and every bound a peer could try to break."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.wanrt.protocol.pair import JOB, authenticated_pair, feed
from tests.wanrt.protocol.strategies import assert_same_message, payloads
from wanrt.errors import LimitExceeded, LocalProtocolError, RemoteProtocolError
from wanrt.payload import SparsePayload
from wanrt.protocol import (
    Bye,
    Chunk,
    ChunkCancel,
    Heartbeat,
    ProtocolConfig,
    Push,
    Reassembler,
    split_frame,
)
from wanrt.protocol.connection import Connection
from wanrt.protocol.limits import MIN_CHUNK_BYTES
from wanrt.protocol.messages import Message


def chunked(conn: Connection, msg: Message, *, item_id: int, chunk_bytes: int) -> list[Chunk]:
    """What a gateway's send queue does with a big frame: frame it once, then cut it into Chunks."""
    return split_frame(conn.send_parts(msg), item_id=item_id, chunk_bytes=chunk_bytes)


@settings(max_examples=20, deadline=None)
@given(payloads(), payloads(), st.integers(MIN_CHUNK_BYTES, 3000), st.randoms(use_true_random=False))
def test_interleaved_chunked_pushes_are_reassembled(p1, p2, size, rnd) -> None:  # type: ignore[no-untyped-def]
    pair = authenticated_pair()
    m1 = Push(JOB, 1, p1.layer, 0, "site-a", p1)
    m2 = Push(JOB, 1, p2.layer, 1, "site-a", p2)
    c1 = chunked(pair.client, m1, item_id=10, chunk_bytes=size)
    c2 = chunked(pair.client, m2, item_id=11, chunk_bytes=size)
    assert all(len(c.data) <= size for c in c1 + c2)
    # an EDF queue interleaves the two items and urgent small frames, keeping each item's order
    order = [1] * len(c1) + [2] * len(c2) + [0] * 3
    rnd.shuffle(order)
    queues = {1: list(c1), 2: list(c2)}
    got = []
    for which in order:
        msg = Heartbeat(7, 1.0) if which == 0 else queues[which].pop(0)
        got += pair.c2s(pair.client.send_parts(msg))
    pushes = [m for m in got if isinstance(m, Push)]
    assert sum(isinstance(m, Heartbeat) for m in got) == 3 and len(pushes) == 2
    by_round = {m.round: m for m in pushes}
    assert_same_message(by_round[0], m1)
    assert_same_message(by_round[1], m2)
    assert pair.server.pending_chunked_items == 0


def test_split_frame_keeps_views_and_covers_every_byte() -> None:
    parts = [memoryview(b"h" * 100), memoryview(bytes(range(256)) * 20), memoryview(b"t" * 3000)]
    chunks = split_frame(parts, item_id=5, chunk_bytes=1024)
    blob = b"".join(bytes(p) for p in parts)
    assert b"".join(bytes(c.data) for c in chunks) == blob
    assert [c.offset for c in chunks] == list(range(0, len(blob), 1024))
    assert {c.total for c in chunks} == {len(blob)} and {c.item_id for c in chunks} == {5}
    # a chunk inside one part is a view of it, not a copy
    inner = [c for c in chunks if isinstance(c.data, memoryview)]
    assert inner and all(c.data.obj is not None for c in inner)
    with pytest.raises(LocalProtocolError):
        split_frame(parts, item_id=5, chunk_bytes=10)


def _chunks_of(data: bytes, item_id: int, size: int) -> list[Chunk]:
    return [Chunk(item_id, i, len(data), data[i : i + size]) for i in range(0, len(data), size)]


def test_reassembler_rules() -> None:
    r = Reassembler(max_items=2, max_item_bytes=10_000, max_bytes=15_000)
    a = _chunks_of(bytes(range(200)) * 10, 1, 500)
    assert r.add(a[0]) is None
    with pytest.raises(RemoteProtocolError, match="out of order"):
        r.add(a[2])
    r = Reassembler(max_items=2, max_item_bytes=10_000, max_bytes=15_000)
    for c in a[:-1]:
        assert r.add(c) is None
    assert r.pending == 1 and r.reserved_bytes == 2000
    done = r.add(a[-1])
    assert (
        done is not None
        and bytes(done) == bytes(range(200)) * 10
        and r.pending == 0
        and r.reserved_bytes == 0
    )
    # first chunk must start at 0, totals must agree, item size and count and byte budget are bounded
    with pytest.raises(RemoteProtocolError):
        r.add(Chunk(2, 5, 100, b"x"))
    r.add(Chunk(3, 0, 100, b"x"))
    with pytest.raises(RemoteProtocolError):
        r.add(Chunk(3, 1, 99, b"x"))
    with pytest.raises(LimitExceeded):
        r.add(Chunk(4, 0, 10_001, b"x"))
    r.add(Chunk(5, 0, 9_000, b"x"))
    with pytest.raises(LimitExceeded, match="too many"):
        r.add(Chunk(6, 0, 10, b"x"))
    assert r.cancel(5) and not r.cancel(5)
    assert r.pending == 1 and r.reserved_bytes == 100


def test_reassembly_budget_counts_announced_totals() -> None:
    r = Reassembler(max_items=4, max_item_bytes=10_000, max_bytes=12_000)
    r.add(Chunk(1, 0, 10_000, b"x"))
    with pytest.raises(LimitExceeded, match="budget"):
        r.add(Chunk(2, 0, 2_001, b"x"))
    assert r.add(Chunk(3, 0, 2_000, b"x")) is None


def test_cancelled_item_is_dropped_and_its_id_reusable() -> None:
    pair = authenticated_pair()
    p = SparsePayload.from_dense_blocks(0, np.ones(5000, np.float32), np.arange(300), 16)
    chunks = chunked(pair.client, Push(JOB, 1, 0, 0, "a", p), item_id=3, chunk_bytes=4096)
    pair.c2s(pair.client.send_parts(chunks[0]))
    assert pair.server.pending_chunked_items == 1
    assert pair.c2s(pair.client.send_parts(ChunkCancel(3))) == []
    assert pair.server.pending_chunked_items == 0
    got = []
    for c in chunked(pair.client, Push(JOB, 2, 0, 0, "a", p), item_id=3, chunk_bytes=4096):
        got += pair.c2s(pair.client.send_parts(c))
    assert len(got) == 1 and isinstance(got[0], Push) and got[0].iteration == 2


def test_bye_with_an_unfinished_item_is_a_violation() -> None:
    pair = authenticated_pair()
    p = SparsePayload.from_dense_blocks(0, np.ones(5000, np.float32), np.arange(300), 16)
    first = chunked(pair.client, Push(JOB, 1, 0, 0, "a", p), item_id=3, chunk_bytes=4096)[0]
    pair.c2s(pair.client.send_parts(first))
    with pytest.raises(RemoteProtocolError, match="unfinished"):
        pair.c2s(pair.client.send_parts(Bye()))


def test_chunked_item_must_be_a_frame_the_state_table_allows() -> None:
    pair = authenticated_pair()
    inner = pair.client.send(Heartbeat(1, 1.0))
    # a chunk whose content is itself a chunk frame
    chunk_frame = pair.client.send(Chunk(1, 0, len(inner), inner))
    with pytest.raises(RemoteProtocolError, match="chunk inside"):
        feed(pair.server, pair.client.send(Chunk(2, 0, len(chunk_frame), chunk_frame)))
    # a chunk whose content is a handshake frame
    pair = authenticated_pair()
    from tests.wanrt.protocol.pair import make_pair

    raw_hello = make_pair().client.hello()
    with pytest.raises(RemoteProtocolError, match="may not send Hello"):
        feed(pair.server, pair.client.send(Chunk(3, 0, len(raw_hello), raw_hello)))
    # a chunk whose content is garbage
    pair = authenticated_pair()
    with pytest.raises(RemoteProtocolError):
        feed(pair.server, pair.client.send(Chunk(4, 0, 30, bytes(30))))


def test_relay_mode_hands_chunks_to_the_application() -> None:
    relay = ProtocolConfig(reassemble_chunks=False)
    pair = authenticated_pair(server_config=relay)
    p = SparsePayload.from_dense_blocks(0, np.ones(5000, np.float32), np.arange(300), 16)
    chunks = chunked(pair.client, Push(JOB, 1, 0, 0, "a", p), item_id=3, chunk_bytes=4096)
    got = []
    for c in chunks:
        got += pair.c2s(pair.client.send_parts(c))
    assert got == chunks
    # ... and the application can reassemble them with the same class
    r = Reassembler()
    items = [r.add(c) for c in got]
    assert items[:-1] == [None] * (len(items) - 1) and items[-1] is not None


def _frame_head(pair_client: Connection, msg: Message) -> bytes:
    """The first bytes of a framed message: enough for the receiver to allocate the whole frame."""
    return b"".join(bytes(v) for v in pair_client.send_parts(msg))


@pytest.mark.parametrize("how", ["eof", "abort"])
def test_a_connection_that_ends_frees_its_partial_frame_and_items_at_once(how: str) -> None:
    """Security probe (issue 21): a peer that announces a big frame and drops the link kept that buffer
    alive until the connection object was collected (RSS 1.1-1.4 GB under a frame-and-drop loop). The
    buffers go when the connection ends, whatever still refers to it."""
    pair = authenticated_pair()
    p = SparsePayload.from_dense_blocks(0, np.ones(50_000, np.float32), np.arange(3000), 16)
    first = chunked(pair.client, Push(JOB, 1, 0, 0, "a", p), item_id=3, chunk_bytes=4096)[0]
    pair.c2s(pair.client.send_parts(first))  # an unfinished chunked item
    frame = _frame_head(pair.client, Push(JOB, 2, 0, 0, "a", p))
    feed(pair.server, frame[: len(frame) // 2])  # and half a frame
    assert pair.server.held_bytes >= len(frame) // 2 + 40_000
    if how == "eof":
        with pytest.raises(RemoteProtocolError, match="middle of a frame"):
            feed(pair.server, b"")
    else:
        pair.server.abort(RemoteProtocolError("bye"))
    assert pair.server.held_bytes == 0
    assert pair.server.pending_chunked_items == 0
