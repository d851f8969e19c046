"""A streamed push (``RoundEngine.local_piece`` before ``local_push``): the same bits as a whole push,
slices forwarded before the push is whole, nothing counted from an interrupted stream."""

from __future__ import annotations

import random

import numpy as np
import pytest

from gateways.config import GatewayConfig
from gateways.node import GatewayNode
from gateways.rounds.actions import Deliver, PeerSuspect, Send
from gateways.rounds.config import RoundConfig
from gateways.rounds.engine import RoundEngine
from gateways.rounds.topology import PlanSpec
from wanrt.errors import RemoteProtocolError
from wanrt.payload import SparsePayload, n_blocks
from wanrt.protocol.push_pieces import cut_push, push_cut_hint

SITES = ("a", "b", "c")
LAYER = 2
BS = 16
DENSE_LEN = BS * 3001 - 5
CHUNK = 4096  # 16 pieces per segment


def _payload(site: int, *, dtype: str = "fp16", density: float = 1.0) -> SparsePayload:
    rng = np.random.default_rng(7 + site)
    nb = n_blocks(DENSE_LEN, BS)
    idx = np.arange(nb, dtype=np.int64) if density >= 1 else np.flatnonzero(rng.random(nb) < density)
    dense = (rng.standard_normal(DENSE_LEN) * 10.0 ** rng.integers(-3, 3, DENSE_LEN)).astype(np.float32)
    p = SparsePayload.from_dense_blocks(LAYER, dense, idx.astype(np.int64), BS)
    if dtype == "fp16":
        p = SparsePayload(LAYER, DENSE_LEN, BS, p.indices, p.values.astype(np.float16), "fp16")
    return p


def _pieces(site: str, p: SparsePayload, it: int = 0) -> list[tuple[int, int, SparsePayload]]:
    cut = cut_push("job", it, LAYER, site, p, (len(SITES), CHUNK, SITES.index(site)))
    assert cut is not None
    return [(q.lo, q.hi, q.payload) for q in cut]


class _Run:
    def __init__(self, cfg: RoundConfig, seed: int) -> None:
        self.engines = {s: RoundEngine(s, SITES, PlanSpec.make("allpairs"), cfg) for s in SITES}
        self.pending: list[tuple[str, Send]] = []
        self.sent: list[tuple[str, Send]] = []
        self.delivered: dict[str, Deliver] = {}
        self.rng = random.Random(seed)
        self.whole: set[str] = set()  # sites whose push was handed over whole
        self.early_finals = 0
        self.suspects: list[tuple[str, str]] = []

    def take(self, src: str, actions: list) -> None:  # type: ignore[type-arg]
        for a in actions:
            if isinstance(a, Send):
                self.early_finals += a.msg.kind == "segment_final" and src not in self.whole
                self.pending.append((src, a))
                self.sent.append((src, a))
            elif isinstance(a, Deliver):
                self.delivered[src] = a
            elif isinstance(a, PeerSuspect):
                self.suspects.append((src, a.peer))

    def step(self) -> None:
        src, a = self.pending.pop(self.rng.randrange(len(self.pending)))
        self.take(a.peer, self.engines[a.peer].peer_message(src, a.msg, now=0.0))

    def drain(self) -> None:
        while self.pending:
            self.step()


def _bits(d: Deliver) -> bytes:
    assert d.payload is not None
    return d.payload.indices.tobytes() + d.payload.values.tobytes() + d.payload.value_dtype.encode()


def _reference(pushed: dict[str, SparsePayload]) -> Deliver:
    run = _Run(RoundConfig(topology="allpairs", allpairs_chunk_bytes=CHUNK), 0)
    for s in SITES:
        run.take(s, run.engines[s].local_push(0, LAYER, pushed[s], now=0.0))
    run.drain()
    return run.delivered["a"]


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("streamed", [("a",), ("a", "b", "c")])
def test_a_streamed_push_gives_the_same_bits_as_a_whole_one(dtype: str, streamed: tuple[str, ...]) -> None:
    pushed = {s: _payload(i, dtype=dtype) for i, s in enumerate(SITES)}
    ref = _reference(pushed)
    for seed in range(3):
        run = _Run(RoundConfig(topology="allpairs", allpairs_chunk_bytes=CHUNK), seed)
        queues = {s: _pieces(s, pushed[s]) for s in streamed}
        early = 0
        whole = run.whole
        while any(queues.values()) or run.pending or len(whole) < len(SITES):
            if run.pending and run.rng.random() < 0.5:  # pieces and peer messages interleaved at random
                run.step()
                continue
            todo = [s for s in SITES if queues.get(s) or s not in whole]
            if not todo:
                continue
            s = run.rng.choice(todo)
            if queues.get(s):
                lo, hi, p = queues[s].pop(0)
                acts = run.engines[s].local_piece(0, LAYER, lo, hi, p, now=0.0)
                early += sum(isinstance(a, Send) and a.msg.kind == "segment" for a in acts)
                run.take(s, acts)
                if not queues[s]:  # the push is whole: counted now, not before
                    run.take(s, run.engines[s].local_push(0, LAYER, pushed[s], now=0.0))
                    whole.add(s)
            else:
                run.take(s, run.engines[s].local_push(0, LAYER, pushed[s], now=0.0))
                whole.add(s)
        assert early == len(streamed) * 2 * 16  # every slice of a streamed push left before it was whole
        assert run.early_finals > 0  # owners finished pieces of their own segment before their push was whole
        assert sum(a.msg.kind == "segment" for _, a in run.sent) == 6 * 16  # none twice
        assert set(run.delivered) == set(SITES)
        assert {_bits(d) for d in run.delivered.values()} == {_bits(ref)}
        assert all(d.sites == tuple((s, 0) for s in SITES) for d in run.delivered.values())


def test_an_interrupted_stream_is_not_counted_until_the_push_is_resent() -> None:
    pushed = {s: _payload(i) for i, s in enumerate(SITES)}
    ref = _reference(pushed)
    cfg = RoundConfig(topology="allpairs", allpairs_chunk_bytes=CHUNK, round_deadline_s=1.0)
    run = _Run(cfg, 1)
    pieces = _pieces("a", pushed["a"])
    for lo, hi, p in pieces[: len(pieces) // 2]:  # the trainer's connection dies half-way
        run.take("a", run.engines["a"].local_piece(0, LAYER, lo, hi, p, now=0.0))
    for s in ("b", "c"):
        run.take(s, run.engines[s].local_push(0, LAYER, pushed[s], now=0.0))
    run.drain()
    for t in (2.0, 10.0, 100.0):  # long past the own-push deadline: site a does not go on without it
        for s in SITES:
            run.take(s, run.engines[s].tick(t))
        run.drain()
    assert not run.delivered  # nothing finished: no result counts half of a's push, or goes without it
    assert all(src != "a" for src, _ in run.suspects)  # a waits for its trainer, not for b or c
    # the trainer reconnects and resends the whole push in pieces: the pieces already forwarded are not
    # sent again, the rest is, and the push is counted once
    before = sum(a.msg.kind == "segment" for src, a in run.sent if src == "a")
    for lo, hi, p in pieces:
        run.take("a", run.engines["a"].local_piece(0, LAYER, lo, hi, p, now=100.0))
    run.take("a", run.engines["a"].local_push(0, LAYER, pushed["a"], now=100.0))
    run.drain()
    assert sum(a.msg.kind == "segment" for src, a in run.sent if src == "a") == 2 * 16 > before
    assert {_bits(d) for d in run.delivered.values()} == {_bits(ref)}
    assert all(d.sites == tuple((s, 0) for s in SITES) for d in run.delivered.values())


def test_a_resent_piece_with_other_values_is_refused() -> None:
    p = _payload(0)
    e = RoundEngine(
        "a", SITES, PlanSpec.make("allpairs"), RoundConfig(topology="allpairs", allpairs_chunk_bytes=CHUNK)
    )
    lo, hi, piece = _pieces("a", p)[1]  # piece 0 of segment 1 (b's): forwarded at once
    assert e.local_piece(0, LAYER, lo, hi, piece, now=0.0)
    assert e.local_piece(0, LAYER, lo, hi, piece, now=0.0) == []  # the same bytes again: nothing to do
    other = SparsePayload(LAYER, DENSE_LEN, BS, piece.indices, piece.values * 2, piece.value_dtype)
    with pytest.raises(RemoteProtocolError):
        e.local_piece(0, LAYER, lo, hi, other, now=0.0)


def test_no_slice_leaves_early_where_the_push_would_not_go_unchanged() -> None:
    p = _payload(0)
    lo, hi, piece = _pieces("a", p)[1]
    for cfg in (
        RoundConfig(topology="ring"),
        RoundConfig(topology="allpairs", allpairs_chunk_bytes=CHUNK, forward_policy="per_site"),
    ):
        e = RoundEngine("a", SITES, None, cfg)
        assert e.local_piece(0, LAYER, lo, hi, piece, now=0.0) == []
    e = RoundEngine(
        "a", SITES, PlanSpec.make("allpairs"), RoundConfig(topology="allpairs", allpairs_chunk_bytes=CHUNK)
    )
    e.local_push(0, LAYER, p, now=0.0)
    assert e.local_piece(0, LAYER, lo, hi, piece, now=0.0) == []  # already pushed whole


def test_cut_push_streams_dense_layers_only() -> None:
    assert cut_push("job", 0, LAYER, "a", _payload(0, density=0.01), (3, CHUNK)) is None  # a direct round
    cut = cut_push("job", 0, LAYER, "a", _payload(0), (3, CHUNK))
    assert cut is not None and len(cut) == 3 * 16
    assert sorted((q.lo, q.hi) for q in cut)[0][0] == 0
    assert sum(q.hi - q.lo for q in cut) == n_blocks(DENSE_LEN, BS)
    assert [(q.lo, q.hi) for q in cut[:3]] == sorted((q.lo, q.hi) for q in cut[:3])  # piece 0 of each segment


@pytest.mark.parametrize("site", SITES)
def test_with_its_gateways_index_every_piece_but_the_last_of_a_group_leaves_at_once(site: str) -> None:
    """The Welcome names the gateway's place in the core; the trainer then sends the segment the gateway
    keeps last in each group, so each of the other pieces is forwarded the moment it lands."""
    node = GatewayNode(
        GatewayConfig(
            site=site,
            job="job",
            secret="x" * 32,
            peers={q: f"tcp://10.0.0.{i + 1}:7700" for i, q in enumerate(SITES) if q != site},
            rounds=RoundConfig(topology="allpairs", allpairs_chunk_bytes=CHUNK),
        ),
        0.0,
    )
    hint = push_cut_hint(node.trainer_welcome_info({"run": "r1"}))
    assert hint == (len(SITES), CHUNK, SITES.index(site))
    cut = cut_push("job", 0, LAYER, site, _payload(SITES.index(site)), hint)
    assert cut is not None
    e = RoundEngine(
        site, SITES, PlanSpec.make("allpairs"), RoundConfig(topology="allpairs", allpairs_chunk_bytes=CHUNK)
    )
    for i, q in enumerate(cut[: 2 * len(SITES)]):
        sends = [a for a in e.local_piece(0, LAYER, q.lo, q.hi, q.payload, now=0.0) if isinstance(a, Send)]
        assert len(sends) == (0 if i % len(SITES) == len(SITES) - 1 else 1), i


def test_no_slice_leaves_early_while_the_layer_carries_a_late_push() -> None:
    pushed = {s: _payload(i) for i, s in enumerate(SITES)}
    run = _Run(RoundConfig(topology="allpairs", allpairs_chunk_bytes=CHUNK, round_deadline_s=1.0), 0)
    for s in ("b", "c"):
        run.take(s, run.engines[s].local_push(0, LAYER, pushed[s], now=0.0))
    run.drain()
    run.take("a", run.engines["a"].tick(2.0))  # a goes on without its own push
    run.drain()
    assert set(run.delivered) == set(SITES)
    a = run.engines["a"]
    run.take("a", a.local_push(0, LAYER, pushed["a"], now=3.0))  # too late: carried into round 1
    lo, hi, piece = _pieces("a", pushed["a"], it=1)[1]
    assert a.local_piece(1, LAYER, lo, hi, piece, now=3.0) == []  # the push will be folded with the carry
    assert a.stats.streamed_slices == 0


@pytest.mark.parametrize("chunk", [0, CHUNK])
def test_a_dense_result_filled_piece_by_piece_is_the_exact_core_order_sum(chunk: int) -> None:
    """The result buffer filled as finished pieces arrive (allpairs.stage_final), checked against a sum
    computed independently: fp32 dense pushes added in core order."""
    pushed = {s: _payload(i, dtype="fp32") for i, s in enumerate(SITES)}
    run = _Run(RoundConfig(topology="allpairs", allpairs_chunk_bytes=chunk), 3)
    for s in SITES:
        run.take(s, run.engines[s].local_push(0, LAYER, pushed[s], now=0.0))
    run.drain()
    want = (pushed["a"].values + pushed["b"].values) + pushed["c"].values
    for d in run.delivered.values():
        assert d.payload is not None and d.payload.value_dtype == "fp32"
        assert np.array_equal(d.payload.indices, np.arange(n_blocks(DENSE_LEN, BS)))
        assert d.payload.values.tobytes() == want.tobytes()
