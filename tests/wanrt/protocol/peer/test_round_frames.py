"""Round messages over the real protocol: every kind round-trips exactly through RoundTag + Push
(also chunked, also interleaved), cumulative acks, and every lie of a peer is a typed error."""

from __future__ import annotations

import itertools

import pytest

from tests.gateways.harness import make_payload
from tests.wanrt.protocol.peer.gateway_pair import gateway_pair
from wanrt.errors import LimitExceeded, LocalProtocolError, RemoteProtocolError
from wanrt.protocol import Aggregate, Connection, Hello, Push, split_frame
from wanrt.protocol.events import NEED_DATA
from wanrt.protocol.messages import decode_message, field_names
from wanrt.protocol.peer.round_frames import (
    GATEWAY_REGISTRY,
    MAX_ACK_GAP,
    MAX_ROUND_IDS,
    SEQ_MODULUS,
    AckWindow,
    JobModel,
    RoundData,
    RoundInbox,
    RoundTag,
    encode_round,
    encode_round_data,
    round_data_wire,
    unwrap,
)
from wanrt.protocol.peer.round_msg import MSG_KINDS, RoundMsg

SECRET = b"wire-test-secret-0123"


def _pair() -> tuple[Connection, Connection]:
    return gateway_pair(SECRET)


def _receive(conn: Connection, data: bytes) -> list[object]:
    conn.receive_data(data)
    out = []
    while (ev := conn.next_event()) is not NEED_DATA:
        out.append(ev)
    return out


def _same(a: RoundMsg, b: RoundMsg) -> bool:
    if (a.kind, a.iteration, a.layer, a.plan_id, a.sites, a.step, a.segment) != (
        b.kind,
        b.iteration,
        b.layer,
        b.plan_id,
        b.sites,
        b.step,
        b.segment,
    ):
        return False
    if a.payload is None or b.payload is None:
        return a.payload is b.payload
    return a.payload.values_f32().tobytes() == b.payload.values_f32().tobytes() and bool(
        (a.payload.indices == b.payload.indices).all()
    )


@pytest.mark.parametrize("kind", MSG_KINDS)
def test_every_kind_round_trips(kind: str) -> None:
    c, s = _pair()
    inbox = RoundInbox("a", "j")
    payload = None if kind == "outcome" else make_payload("a", 7, 3)
    ids = (("a", 6), ("a", 7), ("c", 7))
    msg = RoundMsg(kind, 7, 3, 2**62 + 5, payload, ids, 9, 2 if "segment" in kind else -1)  # type: ignore[arg-type]
    tag, frame = encode_round(msg, seq=SEQ_MODULUS + 4, job="j", site="a")
    assert tag.seq == 4 and tag.payload == (payload is not None)
    if payload is None:
        assert frame is None
    else:
        assert type(frame) is Push  # results too: the tag names the contributions
        assert frame.round == tag.seq
    (got_tag,) = _receive(s, c.send(tag))
    assert isinstance(got_tag, RoundTag)
    out = inbox.on_tag(got_tag)
    if frame is not None:
        assert out is None and inbox.pending == 1
        (got,) = _receive(s, c.send(frame))
        assert isinstance(got, Push)
        _, out = inbox.on_payload(got)
    assert out is not None and _same(out, msg) and inbox.pending == 0


def test_tags_pair_with_their_payloads_when_chunks_interleave() -> None:
    c, s = _pair()
    inbox = RoundInbox("a", "j")
    layers = range(40, 44)  # payloads of a few KiB: several 1 KiB chunks each
    msgs = [
        RoundMsg("partial", i, layer, 1, make_payload("a", i, layer), (("a", i),))
        for i, layer in enumerate(layers)
    ]
    frames = [encode_round(m, seq=i, job="j", site="a") for i, m in enumerate(msgs)]
    # all tags first, then the payload frames' chunks interleaved round-robin, the last message first
    stream = b"".join(c.send(tag) for tag, _ in frames)
    chunked = [
        split_frame(c.send_parts(p), item_id=i, chunk_bytes=1024) for i, (_, p) in enumerate(frames) if p
    ]
    assert all(len(ch) > 1 for ch in chunked)
    order = [ch for group in itertools.zip_longest(*reversed(chunked)) for ch in group if ch is not None]
    stream += b"".join(c.send(ch) for ch in order)
    got: list[RoundMsg] = []
    for ev in _receive(s, stream):
        if isinstance(ev, RoundTag):
            assert inbox.on_tag(ev) is None
        else:
            assert isinstance(ev, Push)
            got.append(inbox.on_payload(ev)[1])
    assert sorted(m.iteration for m in got) == [0, 1, 2, 3]
    for m in got:
        assert _same(m, msgs[m.iteration])


def test_peer_lies_are_typed_errors() -> None:
    inbox = RoundInbox("a", "j", max_pending=2)
    p = make_payload("a", 1, 0)
    with pytest.raises(RemoteProtocolError, match="without a preceding round tag"):
        inbox.on_payload(Push("j", 1, 0, 9, "a", p))
    tag = RoundTag(9, "partial", 1, 0, 1, 0, -1, (("a", 1),), True)
    inbox.on_tag(tag)
    with pytest.raises(RemoteProtocolError, match="reused"):
        inbox.on_tag(tag)
    inbox.on_tag(RoundTag(10, "partial", 1, 0, 1, 0, -1, (("a", 1),), True))
    with pytest.raises(LimitExceeded):
        inbox.on_tag(RoundTag(11, "partial", 1, 0, 1, 0, -1, (("a", 1),), True))
    with pytest.raises(RemoteProtocolError, match="disagrees with its round tag"):
        inbox.on_payload(Push("j", 2, 0, 9, "a", make_payload("a", 2, 0)))
    with pytest.raises(RemoteProtocolError, match="another job or sender"):
        inbox.on_payload(Push("j", 1, 0, 10, "b", p))
    fin = RoundInbox("a", "j")
    fin.on_tag(RoundTag(1, "final", 1, 0, 1, 0, -1, (("a", 1), ("b", 1)), True))
    fin.on_payload(Aggregate("j", 1, 0, 1, "a", p, ("a", "b")))  # an Aggregate that agrees: accepted
    fin.on_tag(RoundTag(2, "final", 1, 0, 1, 0, -1, (("a", 1), ("b", 1)), True))
    with pytest.raises(RemoteProtocolError, match="disagrees with the tag"):
        fin.on_payload(Aggregate("j", 1, 0, 2, "a", p, ("a",)))
    fin.on_tag(RoundTag(3, "partial", 1, 0, 1, 0, -1, (("a", 1),), True))
    with pytest.raises(RemoteProtocolError, match="disagrees with the tag"):
        fin.on_payload(Aggregate("j", 1, 0, 3, "a", p, ("a",)))  # a partial is never an Aggregate


def test_tag_validation_on_both_sides() -> None:
    with pytest.raises(LocalProtocolError):
        RoundTag(0, "gossip", 1, 0, 1, 0, -1, (), False)
    with pytest.raises(LocalProtocolError):
        RoundTag(0, "partial", 1, 0, 1, 0, -2, (), False)
    with pytest.raises(LocalProtocolError):
        RoundTag(SEQ_MODULUS, "partial", 1, 0, 1, 0, -1, (), False)
    with pytest.raises(LocalProtocolError):
        JobModel({"bad key!": 1})
    header, buffers = RoundTag(0, "partial", 1, 0, 1, 0, -1, (("a", 1), ("b", 0)), False).to_wire()
    # the ids travel as one buffer (wanrt.protocol.peer.contrib_ids), the header holds their count
    assert header["ids"] == 2 and [bytes(b) for b in buffers] == [b"0=b;1=a"]
    assert decode_message(RoundTag, header, buffers, peer="a").ids == (("a", 1), ("b", 0))
    # the older form, a header map without a buffer, is still accepted
    old = decode_message(RoundTag, {**header, "ids": {"a": [1], "b": [0]}}, [], peer="a")
    assert old.ids == (("a", 1), ("b", 0))
    for key, bad in (("ids", {"!": [1]}), ("ids", {"a": "1"}), ("ids", [["a", 1]]), ("kind", "gossip")):
        with pytest.raises(RemoteProtocolError):
            decode_message(RoundTag, {**header, key: bad}, [], peer="a")
    with pytest.raises(LimitExceeded):
        decode_message(RoundTag, {**header, "ids": {"a": list(range(MAX_ROUND_IDS + 1))}}, [], peer="a")
    with pytest.raises(LimitExceeded):
        decode_message(RoundTag, {**header, "ids": MAX_ROUND_IDS + 1}, buffers, peer="a")
    for n, blob in (
        (2, b"0=b;1=\xff"),  # not ASCII
        (2, b"0=b,a"),  # names out of order
        (2, b"0=a,a"),  # a duplicate
        (2, b"1=a;0=b"),  # iterations out of order
        (2, b"0=a;-1=b"),  # not a counter
        (2, b"0=a;x=b"),
        (2, b"0=a,!b"),  # not a site name
        (1, b"0=a,b"),  # the count disagrees
        (2, b"0a,b"),
    ):
        with pytest.raises(RemoteProtocolError):
            decode_message(RoundTag, {**header, "ids": n}, [memoryview(blob)], peer="a")
    with pytest.raises(RemoteProtocolError):  # a map form with a buffer, a count without one
        decode_message(RoundTag, {**header, "ids": {"a": [1]}}, buffers, peer="a")
    with pytest.raises(RemoteProtocolError):
        decode_message(RoundTag, header, [], peer="a")


def test_cumulative_acks_cover_the_contiguous_prefix() -> None:
    w = AckWindow("a", max_gap=8)
    tags = [RoundTag(i % SEQ_MODULUS, "partial", i, 0, 1, 0, -1, (), False) for i in range(6)]
    assert w.due() is None
    w.taken(tags[1])  # arrived before 0 (EDF sends urgent messages first)
    assert w.due() is None
    w.taken(tags[0])
    assert w.due() == (1, 0, 1)
    assert w.due() is None
    w.taken(tags[3])
    w.taken(tags[2])
    assert w.due() == (3, 0, 3)
    with pytest.raises(LimitExceeded):
        w.taken(tags[3])  # reused: maps far ahead
    with pytest.raises(LimitExceeded):
        w.taken(RoundTag(4 + 8, "partial", 0, 0, 1, 0, -1, (), False))
    assert unwrap(5, SEQ_MODULUS * 3 + 2) == SEQ_MODULUS * 3 + 5
    assert unwrap(1, SEQ_MODULUS - 1) == SEQ_MODULUS + 1
    assert MAX_ACK_GAP > 1000


@pytest.mark.parametrize("kind", [k for k in MSG_KINDS if k != "outcome"])
def test_a_round_message_with_a_small_payload_is_one_round_data_frame(kind: str) -> None:
    c, s = _pair()
    inbox = RoundInbox("a", "j")
    ids = (("a", 6), ("a", 7), ("c", 7))
    msg = RoundMsg(kind, 7, 3, 2**62 + 5, make_payload("a", 7, 3), ids, 9, 2 if "segment" in kind else -1)  # type: ignore[arg-type]
    frame = encode_round_data(msg, seq=SEQ_MODULUS + 4)
    assert frame.seq == 4 and frame.payload is True
    (got,) = _receive(s, c.send(frame))
    assert type(got) is RoundData
    out = inbox.on_data(got)
    assert _same(out, msg) and inbox.pending == 0


def test_round_data_lies_are_typed_errors() -> None:
    p = make_payload("a", 1, 0)
    good = encode_round_data(RoundMsg("partial", 1, 0, 1, p, (("a", 1),)), seq=3)
    header, buffers = good.to_wire()
    decode_message(RoundData, dict(header), buffers)  # the honest form decodes
    lies = [
        ({**header, "layer": 5}, buffers),  # the payload names another layer
        ({**header, "payload": False}, buffers),  # a RoundData without a payload
        ({k: v for k, v in header.items() if k != "data"}, buffers),  # no payload map
        (dict(header), buffers[:1]),  # the payload's buffers missing
        ({**header, "ids": 2}, buffers),  # ids disagree with their count
    ]
    for h, b in lies:
        with pytest.raises(RemoteProtocolError):
            decode_message(RoundData, h, b)
    inbox = RoundInbox("a", "j")
    tag, _ = encode_round(RoundMsg("partial", 1, 0, 1, p, (("a", 1),)), seq=3, job="j", site="a")
    assert inbox.on_tag(tag) is None
    with pytest.raises(RemoteProtocolError, match="reused"):
        inbox.on_data(good)  # the same sequence number as a tag still waiting for its payload


@pytest.mark.parametrize("kind", [k for k in MSG_KINDS if k != "outcome"])
def test_round_data_wire_is_the_frame_of_encode_round_data(kind: str) -> None:
    """The sender's path without a RoundData object frames the very same bytes, and the receiver gets the
    same RoundData; the header keys keep the dataclass's field order."""
    c, s = _pair()
    ids = (("a", 6), ("a", 7), ("c", 7))
    msg = RoundMsg(kind, 7, 3, 2**62 + 5, make_payload("a", 7, 3), ids, 9, 2 if "segment" in kind else -1)  # type: ignore[arg-type]
    obj = encode_round_data(msg, seq=SEQ_MODULUS + 4)
    header, buffers = round_data_wire(msg, seq=SEQ_MODULUS + 4)
    want_header, want_buffers = obj.to_wire()
    assert list(header.items()) == list(want_header.items())
    assert list(header) == [*field_names(RoundData)]
    assert [bytes(b) for b in buffers] == [bytes(b) for b in want_buffers]
    c2, _ = _pair()
    assert b"".join(c.send_header(RoundData, header, buffers)) == c2.send(obj)
    (got,) = _receive(s, b"".join(c.send_header(RoundData, *round_data_wire(msg, seq=5))))
    assert type(got) is RoundData and got.seq == 5 and _same(got.round_msg(), msg)


def test_round_data_wire_checks_what_the_dataclass_checks() -> None:
    p = make_payload("a", 1, 0)
    for bad in (
        RoundMsg("nonsense", 1, 0, 1, p, (("a", 1),)),  # type: ignore[arg-type]
        RoundMsg("partial", 1, 1, 1, p, (("a", 1),)),  # the payload names another layer
        RoundMsg("partial", -1, 0, 1, p, (("a", 1),)),
        RoundMsg("segment", 1, 0, 1, p, (("a", 1),), 0, -2),
    ):
        with pytest.raises(LocalProtocolError):
            encode_round_data(bad, seq=1)
        with pytest.raises(LocalProtocolError):
            round_data_wire(bad, seq=1)


def test_send_header_refuses_what_send_parts_refuses() -> None:
    c, _ = _pair()
    header, buffers = round_data_wire(
        RoundMsg("partial", 1, 0, 1, make_payload("a", 1, 0), (("a", 1),)), seq=1
    )
    with pytest.raises(LocalProtocolError, match="not a registered"):
        Connection("gateway", "a", "j", SECRET, side="client").send_header(RoundData, header, buffers)
    with pytest.raises(LocalProtocolError, match="not a stream message"):
        c.send_header(Hello, {}, [])
    fresh = Connection("gateway", "a", "j", SECRET, side="client", registry=GATEWAY_REGISTRY)
    with pytest.raises(LocalProtocolError, match="may not send"):
        fresh.send_header(RoundData, header, buffers)  # before the handshake
    with pytest.raises(LocalProtocolError, match="ERROR"):
        fresh.send_header(RoundData, header, buffers)  # a refused send ends in ERROR, as send_parts does
