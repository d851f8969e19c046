"""Message schemas: exact round trips of every type (all payload dtypes and block sizes), validation on
build (LocalProtocolError) and on decode (RemoteProtocolError / LimitExceeded)."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.wanrt.protocol.pair import authenticated_pair
from tests.wanrt.protocol.strategies import (
    assert_same_message,
    infos,
    names,
    payloads,
    session_end_messages,
    stream_messages,
)
from wanrt.errors import LimitExceeded, LocalProtocolError, RemoteProtocolError
from wanrt.payload import SparsePayload
from wanrt.protocol import (
    Ack,
    Aggregate,
    Auth,
    Chunk,
    ConfigUpdate,
    Heartbeat,
    Hello,
    Message,
    ProtocolConfig,
    Push,
    Role,
    Telemetry,
    Welcome,
)
from wanrt.protocol.frame import FrameReader, encode_frame
from wanrt.protocol.limits import MAX_INFO_KEYS, MAX_SITES, MAX_TELEMETRY_KEYS, NONCE_BYTES
from wanrt.protocol.messages import decode_message
from wanrt.protocol.registry import CORE_REGISTRY


def frame_round_trip(msg: Message) -> Message:
    header, buffers = msg.to_wire()
    blob = b"".join(encode_frame(1, msg.TYPE, header, buffers))
    reader = FrameReader()
    reader.feed(blob)
    frame = reader.next_frame(lambda fixed: None)
    assert frame is not None and not reader.mid_frame
    cls = CORE_REGISTRY.get(frame.msg_type)
    assert cls is type(msg)
    return decode_message(cls, frame.header, frame.buffers)


handshake_messages = st.one_of(
    st.builds(
        Hello,
        names,
        names,
        st.sampled_from(list(Role)),
        st.lists(st.integers(1, 255), min_size=1, max_size=16, unique=True).map(tuple),
        st.binary(min_size=NONCE_BYTES, max_size=NONCE_BYTES),
        st.integers(16 * 1024, 256 * 1024 * 1024),
        infos,
    ),
    st.builds(Auth, st.binary(min_size=32, max_size=32)),
)


@st.composite
def welcomes(draw: st.DrawFn) -> Welcome:
    versions = tuple(draw(st.lists(st.integers(1, 255), min_size=1, max_size=16, unique=True)))
    return Welcome(
        draw(names),
        draw(names),
        draw(st.sampled_from(list(Role))),
        versions,
        draw(st.sampled_from(versions)),
        draw(st.binary(min_size=32, max_size=32)),
        draw(st.binary(min_size=32, max_size=32)),
        draw(st.integers(16 * 1024, 256 * 1024 * 1024)),
        draw(infos),
    )


@settings(max_examples=100, deadline=None)
@given(st.one_of(handshake_messages, welcomes(), session_end_messages, stream_messages))
def test_every_message_round_trips_through_a_frame(msg: Message) -> None:
    assert_same_message(frame_round_trip(msg), msg)


RELAY = ProtocolConfig(reassemble_chunks=False)  # so that arbitrary Chunk messages come out as events


@settings(max_examples=50, deadline=None)
@given(st.lists(stream_messages, min_size=1, max_size=5), st.sampled_from([None, 13, 500]))
def test_stream_messages_round_trip_through_connections(msgs: list[Message], step: int | None) -> None:
    pair = authenticated_pair(client_config=RELAY, server_config=RELAY)
    for i, msg in enumerate(msgs):
        sender = pair.client if i % 2 == 0 else pair.server
        got = pair.send(sender, msg, step=step)
        assert len(got) == 1
        assert isinstance(got[0], Message)
        assert_same_message(got[0], msg)


@settings(max_examples=15, deadline=None)
@given(payloads())
def test_payloads_survive_byte_by_byte_delivery(p: SparsePayload) -> None:
    pair = authenticated_pair()
    msg = Push("job-1", 3, p.layer, 0, "site-a", p)
    (got,) = pair.send(pair.client, msg, step=1)
    assert isinstance(got, Push)
    assert_same_message(got, msg)


def _push(**over: Any) -> Push:
    p = SparsePayload.empty(layer=over.pop("payload_layer", 2), dense_len=10, block_size=1)
    args: dict[str, Any] = {"job": "j", "iteration": 1, "layer": 2, "round": 0, "sender": "s", "payload": p}
    args.update(over)
    return Push(**args)


@pytest.mark.parametrize(
    "build",
    [
        lambda: _push(iteration=-1),
        lambda: _push(iteration=2**63),
        lambda: _push(iteration=True),
        lambda: _push(layer=3),  # disagrees with payload.layer
        lambda: _push(job=""),
        lambda: _push(job="a b"),
        lambda: _push(sender="x" * 65),
        lambda: _push(payload="nope"),
        lambda: Heartbeat(1, float("nan")),
        lambda: Heartbeat(-1, 0.0),
        lambda: Ack(0, 2**32, 0),
        lambda: Telemetry("s", 0, {"m": float("inf")}),
        lambda: Telemetry("s", 0, {"m": "fast"}),
        lambda: Telemetry("s", 0, {f"k{i}": 1.0 for i in range(MAX_TELEMETRY_KEYS + 1)}),
        lambda: ConfigUpdate({"rate": [1, 2]}, 0),
        lambda: ConfigUpdate({"rate": b"x"}, 0),
        lambda: Aggregate("j", 1, 2, 0, "s", _push().payload, ()),
        lambda: Aggregate("j", 1, 2, 0, "s", _push().payload, ("a", "a")),
        lambda: Aggregate("j", 1, 2, 0, "s", _push().payload, tuple(f"s{i}" for i in range(MAX_SITES + 1))),
        lambda: Chunk(0, 0, 10, b""),
        lambda: Chunk(0, 5, 10, b"123456"),
        lambda: Chunk(0, 0, 0, b"1"),
        lambda: Hello("j", "s", "wizard", (1,), bytes(32)),
        lambda: Hello("j", "s", "gateway", (1,), bytes(31)),
        lambda: Hello("j", "s", "gateway", (), bytes(32)),
        lambda: Hello("j", "s", "gateway", (1, 1), bytes(32)),
        lambda: Hello("j", "s", "gateway", (1,), bytes(32), max_frame=100),
        lambda: Hello("j", "s", "gateway", (1,), bytes(32), info={"k": [1]}),
        lambda: Hello(
            "j", "s", "gateway", (1,), bytes(32), info={f"k{i}": 1 for i in range(MAX_INFO_KEYS + 1)}
        ),
        lambda: Welcome("j", "s", "gateway", (1, 2), 3, bytes(32), bytes(32)),
    ],
)
def test_bad_values_are_refused_when_built(build: Any) -> None:
    with pytest.raises(LocalProtocolError):
        build()


def _decode(cls: type[Message], header: dict[str, Any], buffers: list[memoryview] | None = None) -> Message:
    # through msgpack, as a peer's header would arrive
    wire = msgpack.unpackb(msgpack.packb(header, use_bin_type=True), use_list=False)
    return decode_message(cls, wire, buffers or [])


def test_bad_values_from_a_peer_are_remote_errors() -> None:
    good = {"iteration": 1, "layer": 2, "round": 3}
    assert _decode(Ack, good) == Ack(1, 2, 3)
    for bad in (
        {**good, "layer": "2"},
        {**good, "round": -1},
        {"iteration": 1, "layer": 2},
        {**good, "extra": 1},
        {**good, "layer": None},
    ):
        with pytest.raises(RemoteProtocolError) as info:
            _decode(Ack, bad)
        assert not isinstance(info.value, LocalProtocolError)
    with pytest.raises(LimitExceeded) as lim:
        _decode(Telemetry, {"site": "s", "iteration": 0, "metrics": {f"k{i}": 1.0 for i in range(300)}})
    assert lim.value.fields["name"] == "MAX_TELEMETRY_KEYS"


def test_push_from_a_peer_with_a_lying_payload_is_a_remote_error() -> None:
    p = SparsePayload.from_dense_blocks(2, np.ones(64, np.float32), np.array([0, 3]), 16)
    header, buffers = Push("j", 1, 2, 0, "s", p).to_wire()
    meta = dict(header["payload"])
    for change in ({"count": 3}, {"dense_len": 10}, {"dtype": "int8"}, {"layer": 5}):
        bad = {**header, "payload": {**meta, **change}}
        with pytest.raises(RemoteProtocolError):
            _decode(Push, bad, [memoryview(bytes(b)) for b in buffers])
    with pytest.raises(RemoteProtocolError):
        _decode(Push, {**header, "payload": 7}, [memoryview(bytes(b)) for b in buffers])
    with pytest.raises(RemoteProtocolError):
        _decode(Push, header, [memoryview(bytes(buffers[0]))])


def test_messages_are_immutable() -> None:
    ack = Ack(1, 2, 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ack.layer = 5  # type: ignore[misc]
    info = {"a": 1}
    hello = Hello("j", "s", "gateway", (1,), bytes(32), info=info)
    info["a"] = 2
    assert hello.info == {"a": 1}
