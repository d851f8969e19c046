"""A result streamed by the gateway, put together by the trainer's link (``ResultStreams``), and the two
messages it travels in (``AggregatePiece``, ``AggregateEnd``): bounds checked before anything is kept."""

from __future__ import annotations

import numpy as np
import pytest

from tests.wanrt.protocol.pair import authenticated_pair
from wanrt.client.link.result_streams import ResultStreams
from wanrt.errors import LimitExceeded, LocalProtocolError, RemoteProtocolError
from wanrt.payload import SparsePayload, n_blocks
from wanrt.protocol import CORE_REGISTRY, AggregateEnd, AggregatePiece
from wanrt.protocol.streamed_results import MAX_RESULT_PIECES

JOB = "j"
BS = 4
LENGTHS = (10, 4 * 25 - 1)  # layer 1: 25 blocks, the last one ragged
NB = n_blocks(LENGTHS[1], BS)
VALUES = np.arange(NB * BS, dtype=np.float16)


def _piece(lo: int, hi: int, *, it: int = 0, layer: int = 1, dtype: str = "fp16") -> AggregatePiece:
    vals = VALUES[lo * BS : hi * BS]
    if dtype == "fp32":
        vals = vals.astype(np.float32)
    p = SparsePayload(layer, LENGTHS[layer], BS, np.arange(lo, hi, dtype=np.int64), vals, dtype)
    return AggregatePiece(JOB, it, layer, "gw", lo, hi, p)


def _end(pieces: int, *, it: int = 0, layer: int = 1) -> AggregateEnd:
    return AggregateEnd(JOB, it, layer, 0, "gw", pieces, ("a", "b"))


CUT = [(10, 20), (0, 10), (20, 25)]  # any order


def test_pieces_in_any_order_make_the_whole_result() -> None:
    rs = ResultStreams(LENGTHS, peer="gw")
    for lo, hi in CUT:
        rs.piece(_piece(lo, hi))
    assert len(rs) == 1
    got = rs.end(_end(3))
    assert got is not None and len(rs) == 0
    assert got.layer == 1 and got.dense_len == LENGTHS[1] and got.value_dtype == "fp16"
    assert np.array_equal(got.indices, np.arange(NB)) and got.values.tobytes() == VALUES.tobytes()
    assert rs.end(_end(3)) is None  # nothing of it left: the caller decides (a duplicate, or an error)


@pytest.mark.parametrize(
    ("cut", "pieces"),
    [
        ([(0, 10), (10, 20)], 2),  # does not cover the layer
        (CUT, 4),  # the end counts other pieces than arrived
    ],
)
def test_an_end_that_does_not_match_its_pieces_is_the_gateways_fault(
    cut: list[tuple[int, int]], pieces: int
) -> None:
    rs = ResultStreams(LENGTHS, peer="gw")
    for lo, hi in cut:
        rs.piece(_piece(lo, hi))
    with pytest.raises(RemoteProtocolError):
        rs.end(_end(pieces))


def test_bad_pieces_are_refused_before_anything_is_allocated_or_copied() -> None:
    rs = ResultStreams(LENGTHS, peer="gw")
    unknown = SparsePayload(2, 99, BS, np.arange(0, 2), np.zeros(8, np.float16), "fp16")
    with pytest.raises(RemoteProtocolError):  # a layer the model does not have
        rs.piece(AggregatePiece(JOB, 0, 2, "gw", 0, 2, unknown))
    other = SparsePayload(0, 40, BS, np.arange(0, 2), np.zeros(8, np.float16), "fp16")
    with pytest.raises(RemoteProtocolError):  # the layer's length is not the model's
        rs.piece(AggregatePiece(JOB, 0, 0, "gw", 0, 2, other))
    assert len(rs) == 0
    rs.piece(_piece(0, 10))
    with pytest.raises(RemoteProtocolError):  # overlaps a piece already here
        rs.piece(_piece(5, 12))
    with pytest.raises(RemoteProtocolError):  # another dtype than the stream's
        rs.piece(_piece(10, 12, dtype="fp32"))
    sparse = SparsePayload(1, LENGTHS[1], BS, np.array([12, 14]), np.zeros(8, np.float16), "fp16")
    with pytest.raises(RemoteProtocolError):  # a piece missing blocks of its range
        rs.piece(AggregatePiece(JOB, 0, 1, "gw", 12, 15, sparse))


def test_open_streams_are_bounded() -> None:
    rs = ResultStreams(LENGTHS, peer="gw", max_open=2)
    rs.piece(_piece(0, 1, it=0))
    rs.piece(_piece(0, 1, it=1))
    rs.piece(_piece(1, 2, it=1))  # a piece of an open stream is fine
    with pytest.raises(LimitExceeded):
        rs.piece(_piece(0, 1, it=2))


def test_a_whole_result_or_a_reconnect_drops_what_was_put_together() -> None:
    rs = ResultStreams(LENGTHS, peer="gw")
    rs.piece(_piece(0, 10, it=0))
    rs.piece(_piece(0, 10, it=1))
    rs.drop(0, 1)
    assert rs.end(_end(1, it=0)) is None and len(rs) == 1
    rs.clear()
    assert len(rs) == 0 and rs.end(_end(1, it=1)) is None


def test_the_messages_check_their_bounds_and_cross_a_connection() -> None:
    with pytest.raises(LocalProtocolError):  # range beyond the layer
        AggregatePiece(JOB, 0, 1, "gw", 0, NB + 1, _piece(0, NB).payload)
    with pytest.raises(LocalProtocolError):  # blocks outside the range
        AggregatePiece(JOB, 0, 1, "gw", 0, 5, _piece(3, 8).payload)
    for bad in (0, MAX_RESULT_PIECES + 1):
        with pytest.raises(LocalProtocolError):
            AggregateEnd(JOB, 0, 1, 0, "gw", bad, ("a",))
    with pytest.raises(LocalProtocolError):
        AggregateEnd(JOB, 0, 1, 0, "gw", 1, ("a", "a"))
    with pytest.raises(LocalProtocolError):
        AggregateEnd(JOB, 0, 1, 0, "gw", 1, ())
    assert {AggregatePiece.TYPE, AggregateEnd.TYPE} <= set(CORE_REGISTRY.types)
    # through a real (sans-IO) connection pair, after the handshake
    pair = authenticated_pair()
    (piece,) = pair.send(pair.server, _piece(10, 20, layer=1))
    (end,) = pair.send(pair.server, _end(3))
    assert isinstance(piece, AggregatePiece) and (piece.lo, piece.hi) == (10, 20)
    assert piece.payload.values.tobytes() == VALUES[40:80].tobytes()
    assert isinstance(end, AggregateEnd) and end.pieces == 3 and end.sites == ("a", "b")
