"""The trainer's side of a parameter resync: what it asks, and what it accepts as the job's parameters."""

from __future__ import annotations

import numpy as np
import pytest

from wanrt.client.link.param_resync import SnapshotReceiver, snapshot_frames, snapshot_point
from wanrt.errors import MalformedPayload, RemoteProtocolError
from wanrt.protocol import Notice, ParamAnnounce, ParamChunk, ParamRefuse, ParamRequest
from wanrt.protocol.messages import decode_message

LENGTHS = (5, 0, 7)
SUM = bytes(16)  # a checksum of the right size (these tests stop before it is compared)


def _notice(j: int) -> Notice:
    return Notice("a", "resync", "missed rounds", False, {"iteration": j})


def _asking() -> tuple[SnapshotReceiver, ParamRequest]:
    r = SnapshotReceiver(LENGTHS)
    req = r.on_notice(_notice(9))
    assert req is not None and req.iteration == 9 and req.lengths == LENGTHS and r.holding
    return r, req


def test_a_snapshot_goes_through_and_says_which_results_it_holds() -> None:
    r, req = _asking()
    layers = [np.arange(n, dtype=np.float32) for n in LENGTHS]
    snap = None
    for frame in snapshot_frames(req.request, 11, [(11, 2)], layers, chunk=3):
        if isinstance(frame, ParamAnnounce):
            r.on_announce(frame)
        else:
            snap = r.on_chunk(frame) or snap
    assert snap is not None and not r.holding and r.done == 9
    assert [a.tolist() for a in snap.layers] == [a.tolist() for a in layers]
    assert not snap.wants(10, 0) and snap.wants(11, 0) and not snap.wants(11, 2)
    assert r.on_notice(_notice(9)) is None  # told again after a reconnect: already done


def test_an_announce_of_another_model_is_refused_before_anything_is_allocated() -> None:
    r, req = _asking()
    with pytest.raises(RemoteProtocolError, match="this model has 3"):
        r.on_announce(ParamAnnounce(req.request, 9, (5, 0, 1 << 30), checksum=SUM))
    assert r._staging is None
    with pytest.raises(RemoteProtocolError, match="asked for 9"):
        r.on_announce(ParamAnnounce(req.request, 8, LENGTHS, checksum=SUM))


@pytest.mark.parametrize(
    ("layer", "offset", "n"), [(0, 1, 2), (2, 0, 3), (0, 0, 6)], ids=["gap", "skipped layer", "past the end"]
)
def test_a_chunk_out_of_order_or_range_is_refused(layer: int, offset: int, n: int) -> None:
    r, req = _asking()
    r.on_announce(ParamAnnounce(req.request, 9, LENGTHS, checksum=SUM))
    with pytest.raises(RemoteProtocolError, match="expected layer 0 at 0"):
        r.on_chunk(ParamChunk(req.request, layer, offset, np.zeros(n, np.float32)))


def test_non_finite_values_are_refused() -> None:
    r, req = _asking()
    r.on_announce(ParamAnnounce(req.request, 9, LENGTHS, checksum=SUM))
    with pytest.raises(MalformedPayload):
        r.on_chunk(ParamChunk(req.request, 0, 0, np.array([1, np.nan, 0, 0, 0], np.float32)))


def test_a_refusal_restarts_the_transfer_and_no_resync_at_the_gateway_ends_the_hold() -> None:
    r, req = _asking()
    r.on_announce(ParamAnnounce(req.request, 9, LENGTHS, checksum=SUM))
    assert not r.on_refuse(ParamRefuse(req.request, "the link to site b went down"))
    assert r.holding and r.on_chunk(ParamChunk(req.request, 0, 0, np.zeros(5, np.float32))) is None
    assert r.on_refuse(ParamRefuse(req.request, "no parameter resync is pending for that iteration"))
    assert not r.holding and r.failed == 1


def test_a_site_answers_once_every_result_below_the_asked_iteration_is_in() -> None:
    applied = {(it, la) for it in range(12) for la in range(3)} | {(12, 1)}
    assert snapshot_point(13, 12, lambda i, la: (i, la) in applied, 13, 3) is None
    assert snapshot_point(10, 12, lambda i, la: (i, la) in applied, 13, 3) == (12, ((12, 1),))


def _transfer(r: SnapshotReceiver, frames: list[ParamAnnounce | ParamChunk]) -> object:
    snap = None
    for frame in frames:
        if isinstance(frame, ParamAnnounce):
            r.on_announce(frame)
        else:
            snap = r.on_chunk(frame) or snap
    return snap


def test_a_snapshot_that_fails_its_checksum_is_never_swapped_in_and_is_asked_for_again() -> None:
    r, req = _asking()
    layers = [np.arange(n, dtype=np.float32) for n in LENGTHS]
    for attempt in range(3):
        frames = list(snapshot_frames(req.request, 9, [], layers, chunk=3))
        last = frames[-1]
        assert isinstance(last, ParamChunk)
        frames[-1] = ParamChunk(last.request, last.layer, last.offset, last.values + np.float32(1))  # altered
        assert _transfer(r, frames) is None  # assembled in full, but not what was sent
        assert r.reask and r.holding and r.corrupt == attempt + 1
        again = r.ask_again()
        assert again is not None and again.iteration == 9 and not r.reask
        req = again
    snap = _transfer(r, list(snapshot_frames(req.request, 9, [], layers, chunk=3)))
    assert snap is not None and not r.holding and r.corrupt == 0  # an intact one goes through


def test_a_snapshot_without_a_checksum_or_failing_it_too_often_is_an_error() -> None:
    r, req = _asking()
    with pytest.raises(RemoteProtocolError, match="without a checksum"):
        r.on_announce(ParamAnnounce(req.request, 9, LENGTHS))
    layers = [np.zeros(n, np.float32) for n in LENGTHS]
    with pytest.raises(RemoteProtocolError, match="failed their checksum"):
        for _ in range(4):
            frames = list(snapshot_frames(req.request, 9, [], layers))
            ann = frames[0]
            assert isinstance(ann, ParamAnnounce)
            frames[0] = ParamAnnounce(ann.request, ann.iteration, ann.lengths, ann.extras, checksum=bytes(16))
            _transfer(r, frames)
            again = r.ask_again()
            assert again is not None
            req = again


def test_the_checksum_travels_on_the_wire_and_is_checked() -> None:
    msg = ParamAnnounce(1, 9, LENGTHS, (), checksum=bytes(range(16)))
    back = decode_message(ParamAnnounce, *msg.to_wire())
    assert isinstance(back, ParamAnnounce) and back.checksum == bytes(range(16))
    header, buffers = msg.to_wire()
    with pytest.raises(RemoteProtocolError, match="checksum"):
        decode_message(ParamAnnounce, {**header, "checksum": b"short"}, buffers)


def test_the_messages_check_their_buffers_against_their_counts() -> None:
    header, buffers = ParamAnnounce(1, 9, LENGTHS, ((9, 1),)).to_wire()
    with pytest.raises(RemoteProtocolError, match="disagree with their count"):
        decode_message(ParamAnnounce, {**header, "lengths": 4}, [memoryview(bytes(b)) for b in buffers])
    header, buffers = ParamChunk(1, 0, 0, np.ones(3, np.float32)).to_wire()
    with pytest.raises(RemoteProtocolError, match="fp32"):
        decode_message(ParamChunk, header, [memoryview(bytes(buffers[0])[:5])])
    msg = decode_message(ParamRequest, *ParamRequest(2, 9, LENGTHS).to_wire())
    assert isinstance(msg, ParamRequest) and msg.lengths == LENGTHS
