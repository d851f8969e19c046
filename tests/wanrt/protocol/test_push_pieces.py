"""PushPiece on the wire, and the trainer's cut agreeing with the gateways' forwarding cut."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from gateways.rounds.allpairs import piece_bounds, piece_count
from tests.wanrt.protocol.pair import authenticated_pair
from wanrt.errors import RemoteProtocolError
from wanrt.payload import SparsePayload, n_blocks
from wanrt.protocol import PushPiece
from wanrt.protocol.messages import decode_message
from wanrt.protocol.push_pieces import (
    PUSH_OWN_KEY,
    cut_push,
    push_cut_hint,
    push_cut_value,
    stream_pieces,
    stream_ranges,
)


def _dense(dense_len: int = 16 * 300 - 3, bs: int = 16) -> SparsePayload:
    rng = np.random.default_rng(3)
    p = SparsePayload.from_dense_blocks(
        1, rng.standard_normal(dense_len).astype(np.float32), np.arange(n_blocks(dense_len, bs)), bs
    )
    return SparsePayload(1, dense_len, bs, p.indices, p.values.astype(np.float16), "fp16")


def test_pieces_cross_a_connection_and_rebuild_the_push() -> None:
    p = _dense()
    cut = cut_push("job-1", 4, 1, "site-a", p, (3, 1024))
    assert cut is not None and len(cut) > 3
    pair = authenticated_pair()
    got = [m for q in cut for m in pair.send(pair.client, q, step=None)]
    assert all(isinstance(m, PushPiece) for m in got)
    back = sorted((m.lo, m.hi, m.payload) for m in got if isinstance(m, PushPiece))
    assert [m.lo for m in got if isinstance(m, PushPiece)] == [q.lo for q in cut]
    assert np.array_equal(np.concatenate([x.indices for _, _, x in back]), p.indices)
    assert np.concatenate([x.values for _, _, x in back]).tobytes() == p.values.tobytes()


def test_a_piece_outside_its_range_from_a_peer_is_its_fault() -> None:
    p = _dense()
    header, buffers = PushPiece("j", 0, 1, "s", 0, n_blocks(p.dense_len, 16), p).to_wire()
    wire = msgpack.unpackb(msgpack.packb({**header, "hi": 5}, use_bin_type=True), use_list=False)
    with pytest.raises(RemoteProtocolError, match="outside its range"):
        decode_message(PushPiece, wire, [memoryview(bytes(b)) for b in buffers])
    wire = msgpack.unpackb(msgpack.packb({**header, "lo": 10**6}, use_bin_type=True), use_list=False)
    with pytest.raises(RemoteProtocolError):
        decode_message(PushPiece, wire, [memoryview(bytes(b)) for b in buffers])


@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize("chunk", [4096, 1 << 20])
@pytest.mark.parametrize("dense_len", [16 * 3001 - 5, 5_000_000])
def test_the_trainers_cut_is_the_gateways(n: int, chunk: int, dense_len: int) -> None:
    k = stream_pieces(dense_len, 16, n, chunk)
    assert k == piece_count((dense_len, 16), n, chunk)
    total = n_blocks(dense_len, 16)
    b = piece_bounds(total, n, k)
    want = [(int(b[g * k + j]), int(b[g * k + j + 1])) for j in range(k) for g in range(n)]
    assert stream_ranges(total, n, k) == [(lo, hi) for lo, hi in want if lo < hi]


@pytest.mark.parametrize("n", [2, 3, 5])
def test_the_gateways_own_segment_goes_last_in_every_group(n: int) -> None:
    total, k = 16 * 3001 - 5, 4
    b = piece_bounds(total, n, k)
    for own in range(n):
        got = stream_ranges(total, n, k, own)
        assert sorted(got) == sorted(stream_ranges(total, n, k))  # the same pieces, only reordered
        for j in range(k):
            group = got[j * n : (j + 1) * n]
            owners = [int(np.searchsorted(b, lo, side="right") - 1) // k for lo, _ in group]
            assert owners == [(own + 1 + i) % n for i in range(n)]  # round the core from own, own last


def test_the_hint_is_read_defensively() -> None:
    assert push_cut_hint({"push_cut": push_cut_value(3, 1 << 20)}) == (3, 1 << 20, -1)
    assert push_cut_hint({"push_cut": push_cut_value(3, 1 << 20), PUSH_OWN_KEY: 2}) == (3, 1 << 20, 2)
    assert push_cut_hint({}) is None
    for bad in (3, "0:5", "3:-1", "3:5:1", "a:b", "3:0"):
        assert push_cut_hint({"push_cut": bad}) is None
    for bad_own in (3, -1, "1", 1.0, True):  # out of the core, or not an int: the plain order
        assert push_cut_hint({"push_cut": "3:4096", PUSH_OWN_KEY: bad_own}) == (3, 4096, -1)
