"""Results streamed to the trainer (``RoundConfig.stream_results``): every finished piece of a dense all-pairs
round is handed over as it is final (``DeliverPiece``), and the round's ``Deliver`` says whether they are
its result (``streamed``)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from gateways.rounds.actions import Action, Deliver, DeliverPiece, Send
from gateways.rounds.config import RoundConfig
from gateways.rounds.engine import RoundEngine
from gateways.rounds.topology import PlanSpec
from wanrt.payload import SparsePayload, n_blocks

SITES = ("a", "b", "c")
LAYER = 1
BS = 16
DENSE_LEN = BS * 1201 - 3
CHUNK = 4096  # 64 fp32 blocks per piece: 7 pieces per ~400-block segment


def _payload(site: int, *, density: float = 1.0, seed: int = 0) -> SparsePayload:
    rng = np.random.default_rng(100 * seed + site)
    nb = n_blocks(DENSE_LEN, BS)
    idx = np.arange(nb) if density >= 1 else np.flatnonzero(rng.random(nb) < density)
    dense = rng.standard_normal(DENSE_LEN).astype(np.float32)
    p = SparsePayload.from_dense_blocks(LAYER, dense, idx.astype(np.int64), BS)
    return SparsePayload(LAYER, DENSE_LEN, BS, p.indices, p.values.astype(np.float16), "fp16")


class _Run:
    """Three engines; messages delivered in a random order; what each site's trainer is handed."""

    def __init__(self, cfg: RoundConfig, seed: int) -> None:
        self.engines = {s: RoundEngine(s, SITES, PlanSpec.make("allpairs"), cfg) for s in SITES}
        self.pending: list[tuple[str, Send]] = []
        self.pieces: dict[str, list[DeliverPiece]] = {s: [] for s in SITES}
        self.delivered: dict[str, Deliver] = {}
        self.rng = random.Random(seed)

    def take(self, site: str, actions: list[Action]) -> None:
        for a in actions:
            if isinstance(a, Send):
                self.pending.append((site, a))
            elif isinstance(a, DeliverPiece):
                assert site not in self.delivered, "a piece after its round's result"
                self.pieces[site].append(a)
            elif isinstance(a, Deliver):
                self.delivered[site] = a

    def run(self, pushed: dict[str, SparsePayload], *, until: int | None = None) -> None:
        for s in SITES:
            self.take(s, self.engines[s].local_push(0, LAYER, pushed[s], now=0.0))
        n = 0
        while self.pending and (until is None or n < until):
            src, a = self.pending.pop(self.rng.randrange(len(self.pending)))
            self.take(a.peer, self.engines[a.peer].peer_message(src, a.msg, now=0.0))
            n += 1


def _assembled(pieces: list[DeliverPiece]) -> np.ndarray:
    out = np.full(n_blocks(DENSE_LEN, BS) * BS, np.nan, dtype=np.float16)
    covered = 0
    for d in pieces:
        assert d.payload.nnz_blocks == d.hi - d.lo  # dense over its range
        assert np.isnan(out[d.lo * BS : d.hi * BS]).all()  # no piece twice
        out[d.lo * BS : d.hi * BS] = d.payload.values
        covered += d.hi - d.lo
    assert covered == n_blocks(DENSE_LEN, BS)
    return out


@pytest.mark.parametrize("seed", range(3))
def test_the_pieces_handed_over_are_the_result_bit_for_bit(seed: int) -> None:
    pushed = {s: _payload(i, seed=seed) for i, s in enumerate(SITES)}
    run = _Run(RoundConfig(topology="allpairs", allpairs_chunk_bytes=CHUNK), seed)
    run.run(pushed)
    for s in SITES:
        d = run.delivered[s]
        assert d.payload is not None and d.streamed == len(run.pieces[s]) == 3 * 7
        assert _assembled(run.pieces[s]).tobytes() == d.payload.values.tobytes()
    # and the result is the one of a round that streams nothing
    ref = _Run(RoundConfig(topology="allpairs", allpairs_chunk_bytes=CHUNK, stream_results=False), seed)
    ref.run(pushed)
    assert all(not p for p in ref.pieces.values())
    assert all(d.streamed == 0 for d in ref.delivered.values())
    ref_a, got_a = ref.delivered["a"].payload, run.delivered["a"].payload
    assert ref_a is not None and got_a is not None and ref_a.values.tobytes() == got_a.values.tobytes()


def test_pieces_stream_before_the_round_ends() -> None:
    pushed = {s: _payload(i) for i, s in enumerate(SITES)}
    run = _Run(RoundConfig(topology="allpairs", allpairs_chunk_bytes=CHUNK), 5)
    run.run(pushed, until=3 * 2 * 7 + 10)  # every slice and a few finished pieces delivered
    assert not run.delivered and any(run.pieces[s] for s in SITES)


def test_a_sparse_round_streams_nothing() -> None:
    pushed = {s: _payload(i, density=0.05) for i, s in enumerate(SITES)}
    run = _Run(RoundConfig(topology="allpairs", allpairs_chunk_bytes=CHUNK), 1)
    run.run(pushed)
    assert all(not p for p in run.pieces.values())
    assert all(d.streamed == 0 for d in run.delivered.values())


def test_a_round_re_run_under_a_new_plan_delivers_its_result_whole() -> None:
    """Pieces streamed under the old plan are not the re-run's: no piece is streamed after the re-run, and
    the Deliver says none of those streamed is the result (the trainer gets it whole)."""
    sites4 = ("a", "b", "c", "d")
    cfg = RoundConfig(topology="allpairs", allpairs_chunk_bytes=CHUNK, quorum=2)
    engines = {s: RoundEngine(s, sites4, PlanSpec.make("allpairs"), cfg) for s in sites4}
    pushed = {s: _payload(i) for i, s in enumerate(sites4)}
    pending: list[tuple[str, Send]] = []
    pieces: dict[str, int] = dict.fromkeys(sites4, 0)
    delivered: dict[str, Deliver] = {}

    def take(site: str, actions: list[Action]) -> None:
        for a in actions:
            if isinstance(a, Send):
                pending.append((site, a))
            elif isinstance(a, DeliverPiece):
                pieces[site] += 1
            elif isinstance(a, Deliver):
                delivered[site] = a

    def deliver_all(now: float) -> None:
        rng = random.Random(3)
        while pending:
            src, a = pending.pop(rng.randrange(len(pending)))
            if a.peer == "d" or (src == "d" and a.msg.kind == "segment_final"):
                continue  # d's finished segment never arrives: no round can end before d is lost
            take(a.peer, engines[a.peer].peer_message(src, a.msg, now=now))

    for s in sites4:
        take(s, engines[s].local_push(0, LAYER, pushed[s], now=0.0))
    deliver_all(0.0)
    before = dict(pieces)
    assert not delivered and all(before[s] > 0 for s in "abc")  # their own segments' pieces streamed
    for s in "abc":
        take(s, engines[s].peer_lost("d", now=1.0))
    deliver_all(1.0)
    exact = sum(pushed[s].values.astype(np.float64) for s in "abc")
    for s in "abc":
        d = delivered[s]
        assert engines[s].stats.restarts == 1 and pieces[s] == before[s]  # nothing streamed after
        assert d.streamed == 0 and d.payload is not None
        assert d.sites == (("a", 0), ("b", 0), ("c", 0))  # the re-run's sum, without d
        np.testing.assert_allclose(d.payload.values.astype(np.float64), exact, rtol=2e-3, atol=2e-3)
