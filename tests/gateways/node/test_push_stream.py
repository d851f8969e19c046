"""Streamed pushes at the node: counted only when whole, dropped with their session, bounded."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gateways.config import GatewayConfig
from gateways.node import GatewayNode, ToTrainer
from gateways.node.push_stream import PushStreams
from wanrt.errors import LimitExceeded, LocalProtocolError, MalformedPayload, RemoteProtocolError
from wanrt.payload import SparsePayload
from wanrt.protocol import Aggregate, Push, PushPiece

BS = 16
NB = 12


def _node(**kw: object) -> GatewayNode:
    cfg = GatewayConfig(site="a", job="j", secret="x" * 32, **kw)  # type: ignore[arg-type]
    node = GatewayNode(cfg, 0.0)
    node.start(0.0)
    node.trainer_connected(1)
    node.pop_actions()
    return node


def _payload(seed: int = 0) -> SparsePayload:
    dense = np.random.default_rng(seed).standard_normal(NB * BS).astype(np.float32)
    return SparsePayload.from_dense_blocks(0, dense, np.arange(NB), BS)


def _pieces(p: SparsePayload, cuts: tuple[int, ...] = (0, 5, 9, NB), it: int = 0) -> list[PushPiece]:
    out = []
    for lo, hi in itertools.pairwise(cuts):
        part = SparsePayload(0, p.dense_len, BS, p.indices[lo:hi], p.values[lo * BS : hi * BS])
        out.append(PushPiece("j", it, 0, "a", lo, hi, part))
    return out


def _aggregates(node: GatewayNode) -> list[Aggregate]:
    return [a.msg for a in node.pop_actions() if isinstance(a, ToTrainer) and isinstance(a.msg, Aggregate)]


def test_a_streamed_push_counts_once_whole_and_equals_the_push() -> None:
    p = _payload()
    node = _node()
    pieces = _pieces(p)
    for q in reversed(pieces[1:]):  # any order
        node.trainer_push_piece(1, q, 0.1)
        assert not _aggregates(node) and node.stats.trainer_pushes == 0
    node.trainer_push_piece(1, pieces[0], 0.2)
    (agg,) = _aggregates(node)
    ref = _node()
    ref.trainer_push(1, Push("j", 0, 0, 0, "a", p), 0.1)
    (want,) = _aggregates(ref)
    assert agg.sites == ("a",) and node.stats.trainer_pushes == 1
    assert np.array_equal(agg.payload.indices, want.payload.indices)
    assert agg.payload.values.tobytes() == want.payload.values.tobytes()


def test_an_interrupted_streamed_push_is_dropped_with_its_session() -> None:
    p = _payload()
    node = _node()
    pieces = _pieces(p)
    for q in pieces[:2]:
        node.trainer_push_piece(1, q, 0.1)
    node.trainer_disconnected(1, "gone")
    node.trainer_connected(2)
    node.pop_actions()
    node.trainer_push_piece(2, pieces[2], 0.2)  # the rest alone does not make a push
    assert not _aggregates(node) and node.stats.trainer_pushes == 0
    node.trainer_push_piece(1, pieces[0], 0.2)  # a replaced session's late frame: ignored
    for q in pieces[:2]:  # resent by the new session
        node.trainer_push_piece(2, q, 0.3)
    (agg,) = _aggregates(node)
    assert node.stats.trainer_pushes == 1 and agg.payload.values.tobytes() == p.values.tobytes()


def test_non_finite_pieces_are_refused_or_dropped() -> None:
    p = _payload()
    p.values[BS * 6] = np.nan
    with pytest.raises(MalformedPayload, match="NaN or Inf"):
        node = _node()
        for q in _pieces(p):
            node.trainer_push_piece(1, q, 0.1)
    node = _node(non_finite="drop_payload")
    for q in _pieces(p):
        node.trainer_push_piece(1, q, 0.1)
    (agg,) = _aggregates(node)
    assert node.stats.non_finite_dropped == 1
    assert agg.payload.indices.tolist() == [*range(5), *range(9, NB)]  # the bad piece's blocks only


def test_pieces_are_bounded_and_must_agree() -> None:
    p = _payload()
    s = PushStreams(max_open=2, max_pieces=3)
    s.add(_pieces(p, (0, 5, NB))[0])
    with pytest.raises(RemoteProtocolError, match="overlap"):
        s.add(_pieces(p, (0, 6, NB))[0])
    with pytest.raises(RemoteProtocolError, match="overlap"):
        s.add(_pieces(p, (0, 3, 6, NB))[1])
    half = SparsePayload(0, p.dense_len, BS, p.indices[6:], p.values[6 * BS :].astype(np.float16), "fp16")
    with pytest.raises(MalformedPayload, match="shape or dtype"):
        s.add(PushPiece("j", 0, 0, "a", 6, NB, half))
    s.add(_pieces(p, (0, 1, 2), it=1)[0])
    with pytest.raises(LimitExceeded):
        s.add(_pieces(p, (0, 1, 2), it=2)[0])  # a third push in flight
    small = PushStreams(max_pieces=2)
    for q in _pieces(p, (0, 1, 2, 3))[:2]:
        small.add(q)
    with pytest.raises(LimitExceeded):
        small.add(_pieces(p, (0, 1, 2, 3))[2])
    assert s.pending == 2
    s.clear()
    assert s.pending == 0


@pytest.mark.parametrize("lo,hi", [(3, 3), (5, 2), (0, NB + 1)])
def test_a_piece_range_is_checked_by_the_message(lo: int, hi: int) -> None:
    p = _payload()
    empty = SparsePayload.empty(0, p.dense_len, BS)
    with pytest.raises(LocalProtocolError, match="lo < hi"):
        PushPiece("j", 0, 0, "a", lo, hi, empty)


def test_a_piece_with_blocks_outside_its_range_is_refused() -> None:
    p = _payload()
    with pytest.raises(LocalProtocolError, match="outside its range"):
        PushPiece("j", 0, 0, "a", 0, 4, p)
