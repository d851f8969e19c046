"""All-pairs cut-through: segments cut into pieces (``allpairs_chunk_bytes``), summed and sent per piece."""

from __future__ import annotations

import random

import numpy as np
import pytest

from gateways.rounds.actions import Deliver, Send
from gateways.rounds.aggregate import segment_bounds
from gateways.rounds.allpairs import cut_blocks, piece_bounds, piece_count
from gateways.rounds.config import RoundConfig
from gateways.rounds.engine import RoundEngine
from gateways.rounds.topology import PlanSpec
from tests.gateways.harness import Net, assert_accounted, make_payload
from wanrt import codec
from wanrt.errors import ConfigError, MalformedPayload, RemoteProtocolError
from wanrt.payload import SparsePayload, n_blocks
from wanrt.protocol.peer.round_msg import RoundMsg

SITES = ("a", "b", "c")
LAYER = 2
BS = 16
DENSE_LEN = BS * 3001 - 5  # uneven segments, a ragged last block
CHUNK = 4096  # 64 fp32 blocks of 16 per piece: 16 pieces per ~1000-block segment


def _payload(site: int, *, density: float = 1.0, dtype: str = "fp32", seed: int = 0) -> SparsePayload:
    rng = np.random.default_rng(100 * seed + site)
    nb = n_blocks(DENSE_LEN, BS)
    idx = np.arange(nb, dtype=np.int64) if density >= 1 else np.flatnonzero(rng.random(nb) < density)
    dense = (rng.standard_normal(DENSE_LEN) * 10.0 ** rng.integers(-3, 3, DENSE_LEN)).astype(np.float32)
    p = SparsePayload.from_dense_blocks(LAYER, dense, idx.astype(np.int64), BS)
    if dtype == "fp16":
        p = SparsePayload(LAYER, DENSE_LEN, BS, p.indices, p.values.astype(np.float16), "fp16")
    return p


def _drive(
    cfg: RoundConfig, pushed: dict[str, SparsePayload], seed: int
) -> tuple[dict[str, Deliver], list[tuple[str, Send]]]:
    """Every message delivered in a random order (any interleaving of links and pieces)."""
    engines = {s: RoundEngine(s, SITES, PlanSpec.make("allpairs"), cfg) for s in SITES}
    pending: list[tuple[str, Send]] = []
    sent: list[tuple[str, Send]] = []
    delivered: dict[str, Deliver] = {}

    def take(src: str, actions: list) -> None:  # type: ignore[type-arg]
        for a in actions:
            if isinstance(a, Send):
                pending.append((src, a))
                sent.append((src, a))
            elif isinstance(a, Deliver):
                delivered[src] = a

    order = list(SITES)
    rng = random.Random(seed)
    rng.shuffle(order)
    for s in order:
        take(s, engines[s].local_push(0, LAYER, pushed[s], now=0.0))
    while pending:
        src, a = pending.pop(rng.randrange(len(pending)))
        take(a.peer, engines[a.peer].peer_message(src, a.msg, now=0.0))
    return delivered, sent


def _bits(d: Deliver) -> bytes:
    assert d.payload is not None
    return d.payload.indices.tobytes() + d.payload.values.tobytes() + d.payload.value_dtype.encode()


def test_piece_bounds_refine_the_segments() -> None:
    nb = n_blocks(DENSE_LEN, BS)
    assert np.array_equal(piece_bounds(nb, 3, 1), segment_bounds(nb, 3))
    b = piece_bounds(nb, 3, 16)
    assert b.shape == (3 * 16 + 1,) and b[0] == 0 and b[-1] == nb
    assert np.all(np.diff(b) > 0)
    assert np.array_equal(b[::16], segment_bounds(nb, 3))  # segment boundaries kept
    assert piece_count((DENSE_LEN, BS), 3, CHUNK) == 16
    assert piece_count((DENSE_LEN, BS), 3, 0) == 1 and piece_count(None, 3, CHUNK) == 1
    assert piece_count((40, BS), 3, CHUNK) == 1  # segments of one block
    with pytest.raises(ConfigError):
        RoundConfig(allpairs_chunk_bytes=100)


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("density", [1.0, 0.6])
def test_pieces_reassemble_bit_identical_to_the_unchunked_round(dtype: str, density: float) -> None:
    pushed = {s: _payload(i, density=density, dtype=dtype) for i, s in enumerate(SITES)}
    ref, ref_sent = _drive(RoundConfig(topology="allpairs", allpairs_chunk_bytes=0), pushed, seed=0)
    assert sum(a.kind == "segment" for _, a in ref_sent) == 6  # one part per link
    for seed in range(4):  # pieces in any order, across and within links
        got, sent = _drive(RoundConfig(topology="allpairs", allpairs_chunk_bytes=CHUNK), pushed, seed)
        assert sum(a.kind == "segment" for _, a in sent) == 6 * 16
        assert sum(a.kind == "segment_final" for _, a in sent) == 6 * 16
        assert {_bits(d) for d in got.values()} == {_bits(ref["a"])}  # every site, the same bits
        assert all(d.sites == tuple((s, 0) for s in SITES) for d in got.values())
    exact = sum(p.values_f32().astype(np.float64).sum() for p in pushed.values())
    total = ref["a"].payload
    assert total is not None and abs(float(total.values_f32().astype(np.float64).sum()) - exact) < 1e-2 * max(
        1.0, abs(exact)
    )


def test_a_whole_sparse_member_is_cut_into_pieces_by_the_owner() -> None:
    pushed = {"a": _payload(0), "b": _payload(1, density=0.01), "c": _payload(2)}
    ref, _ = _drive(RoundConfig(topology="allpairs", allpairs_chunk_bytes=0), pushed, seed=1)
    got, sent = _drive(RoundConfig(topology="allpairs", allpairs_chunk_bytes=CHUNK), pushed, seed=1)
    assert any(src == "b" and a.msg.segment == -1 for src, a in sent)  # b sent its contribution whole
    assert {_bits(d) for d in got.values()} == {_bits(ref["a"])}


def test_direct_sparse_rounds_are_not_cut() -> None:
    pushed = {s: _payload(i, density=0.01) for i, s in enumerate(SITES)}
    ref, _ = _drive(RoundConfig(topology="allpairs", allpairs_chunk_bytes=0), pushed, seed=2)
    got, sent = _drive(RoundConfig(topology="allpairs", allpairs_chunk_bytes=CHUNK), pushed, seed=2)
    assert len(sent) == 6 and all(a.msg.segment == -1 for _, a in sent)
    assert {_bits(d) for d in got.values()} == {_bits(ref["a"])}


def test_many_rounds_with_pieces_account_everything() -> None:
    """The exact-sum harness (4 sites, several iterations and layers, one straggling site): every push
    counted once, identical results everywhere, with layers large enough to be cut."""
    net = Net("abcd", PlanSpec.make("allpairs"), RoundConfig(allpairs_chunk_bytes=CHUNK))
    sent: list[Send] = []
    net.listeners.append(lambda site, a: sent.append(a) if isinstance(a, Send) else None)
    layers = (600, 601, 3)  # 4 pieces per segment (block 16), 2 (block 4), one (tiny)
    for it in range(4):
        for s in "abcd":
            if s == "d" and it == 2:
                continue  # d misses a round: carried into the next
            for layer in layers:
                net.push(s, it, layer, make_payload(s, it, layer, density=0.8))
        net.run()
    assert not net.errors
    assert_accounted(net)
    assert max(a.msg.step for a in sent if a.kind == "segment_final") == 3
    for e in net.engines.values():
        assert not e.open_rounds()


def _owner_b(chunk: int = CHUNK) -> tuple[RoundEngine, int, int]:
    """Engine b (owner of segment 1) after its own push; returns (engine, plan id, pieces)."""
    e = RoundEngine("b", SITES, PlanSpec.make("allpairs"), RoundConfig(allpairs_chunk_bytes=chunk))
    e.local_push(0, LAYER, _payload(1), now=0.0)
    return e, e.plan_for(0).plan_id, piece_count((DENSE_LEN, BS), 3, chunk)


def _piece_of(src: int, g: int, k: int, pieces: int) -> SparsePayload:
    b = piece_bounds(n_blocks(DENSE_LEN, BS), 3, pieces)
    return cut_blocks(_payload(src), int(b[g * pieces + k]), int(b[g * pieces + k + 1]))


def test_a_piece_outside_the_peers_place_is_refused() -> None:
    e, pid, k = _owner_b()
    ids = (("a", 0),)
    with pytest.raises(MalformedPayload):  # piece 3's blocks labelled piece 2
        e.peer_message("a", RoundMsg("segment", 0, LAYER, pid, _piece_of(0, 1, 3, k), ids, 2, 1), now=0.0)
    with pytest.raises(MalformedPayload):  # oversized: pieces 2 and 3 in one message
        two = cut_blocks(
            _payload(0), *(int(x) for x in piece_bounds(n_blocks(DENSE_LEN, BS), 3, k)[[k + 2, k + 4]])
        )
        e.peer_message("a", RoundMsg("segment", 0, LAYER, pid, two, ids, 2, 1), now=0.0)
    with pytest.raises(RemoteProtocolError):  # no piece k
        e.peer_message("a", RoundMsg("segment", 0, LAYER, pid, _piece_of(0, 1, 0, k), ids, k, 1), now=0.0)
    with pytest.raises(RemoteProtocolError):  # b does not own segment 2
        e.peer_message("a", RoundMsg("segment", 0, LAYER, pid, _piece_of(0, 2, 0, k), ids, 0, 2), now=0.0)
    with pytest.raises(RemoteProtocolError):  # a finished piece of segment 2 comes only from c
        e.peer_message(
            "a", RoundMsg("segment_final", 0, LAYER, pid, _piece_of(0, 2, 0, k), ids, 0, 2), now=0.0
        )
    e.peer_message("a", RoundMsg("segment", 0, LAYER, pid, _piece_of(0, 1, 5, k), ids, 5, 1), now=0.0)
    with pytest.raises(RemoteProtocolError):  # each piece once
        e.peer_message("a", RoundMsg("segment", 0, LAYER, pid, _piece_of(0, 1, 5, k), ids, 5, 1), now=0.0)


def test_a_piece_completes_and_is_forwarded_before_the_others_arrive() -> None:
    e, pid, k = _owner_b()
    e.peer_message("a", RoundMsg("segment", 0, LAYER, pid, _piece_of(0, 1, 7, k), (("a", 0),), 7, 1), now=0.0)
    out = e.peer_message(
        "c", RoundMsg("segment", 0, LAYER, pid, _piece_of(2, 1, 7, k), (("c", 0),), 7, 1), now=0.0
    )
    fins = [a for a in out if isinstance(a, Send)]
    assert sorted(a.peer for a in fins) == ["a", "c"]
    assert {(a.kind, a.msg.segment, a.msg.step) for a in fins} == {("segment_final", 1, 7)}
    fin = fins[0].msg.payload
    assert fin is not None
    want = _piece_of(0, 1, 7, k).values + _piece_of(1, 1, 7, k).values + _piece_of(2, 1, 7, k).values
    assert fin.values.tobytes() == want.tobytes()  # core order a, b, c
    assert e.open_rounds() == [(0, LAYER)]


def test_a_truncated_or_oversized_piece_is_refused_off_the_wire() -> None:
    piece = _piece_of(0, 1, 3, 16)
    meta, bufs = codec.encode_payload(piece)
    assert meta["index"] == "run"  # a contiguous piece costs 8 index bytes
    values, index = (bytes(memoryview(b).cast("B")) for b in bufs)
    assert len(index) == 8
    with pytest.raises(MalformedPayload):  # truncated values
        codec.decode_payload(meta, [memoryview(values[:-4]), memoryview(index)])
    with pytest.raises(MalformedPayload):  # values for one block more than the count says
        codec.decode_payload(meta, [memoryview(values + bytes(BS * 4)), memoryview(index)])
    bad = np.array([n_blocks(DENSE_LEN, BS) - 2], "<i8").tobytes()  # a run running past the layer
    with pytest.raises(MalformedPayload):
        codec.decode_payload(meta, [memoryview(values), memoryview(bad)])
    with pytest.raises(MalformedPayload):  # a short run stream
        codec.decode_payload(meta, [memoryview(values), memoryview(index[:4])])
    back = codec.decode_payload(meta, [memoryview(values), memoryview(index)])
    assert back.indices.tobytes() == piece.indices.tobytes()


def test_cap_policy_keeps_one_piece_per_segment() -> None:
    cfg = RoundConfig(
        topology="allpairs", allpairs_chunk_bytes=CHUNK, forward_policy="cap", forward_density=1.0
    )
    pushed = {s: _payload(i) for i, s in enumerate(SITES)}
    _, sent = _drive(cfg, pushed, seed=0)
    assert sum(a.kind == "segment" for _, a in sent) == 6


def test_an_empty_part_stored_before_the_shape_was_known_stands_for_every_piece() -> None:
    """b knows nothing of the layer when c's empty whole part arrives (one piece then); a's dense pieces
    teach it the shape (16 pieces): the empty part must count for all 16, not block pieces 1..15."""
    e = RoundEngine("b", SITES, PlanSpec.make("allpairs"), RoundConfig(allpairs_chunk_bytes=CHUNK))
    pid = e.plan_for(0).plan_id
    assert e.peer_message("c", RoundMsg("segment", 0, LAYER, pid, None, (), 0, -1), now=0.0) == []
    k = piece_count((DENSE_LEN, BS), 3, CHUNK)
    for step in range(k):
        part = _piece_of(0, 1, step, k)
        e.peer_message("a", RoundMsg("segment", 0, LAYER, pid, part, (("a", 0),), step, 1), now=0.0)
    out = e.tick(now=10.0)  # b's own trainer never pushed: past the deadline b goes on without it
    fins = [a for a in out if isinstance(a, Send) and a.kind == "segment_final"]
    assert sorted({a.msg.step for a in fins}) == list(range(k)) and {a.peer for a in fins} == {"a", "c"}
    for a in fins:  # a's slice alone: the empty parts added nothing
        assert a.msg.payload is not None
        assert a.msg.payload.values.tobytes() == _piece_of(0, 1, a.msg.step, k).values.tobytes()
