"""The state table: every (sender side, state, type) combination, orderly close, EOF, ERROR and limits."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pytest

from tests.wanrt.protocol.pair import JOB, Pair, authenticated_pair, feed, make_pair
from wanrt.errors import AuthError, LimitExceeded, LocalProtocolError, RemoteProtocolError
from wanrt.payload import SparsePayload
from wanrt.protocol import (
    CORE_REGISTRY,
    Ack,
    Aggregate,
    AggregateEnd,
    AggregatePiece,
    Auth,
    Bye,
    Chunk,
    ChunkCancel,
    ConfigUpdate,
    Connection,
    ConnectionClosed,
    Error,
    Heartbeat,
    Hello,
    Message,
    Notice,
    Push,
    PushPiece,
    Reject,
    ShardDone,
    ShardGrant,
    ShardRequest,
    Side,
    State,
    Telemetry,
    Welcome,
)
from wanrt.protocol.checks import check_uint
from wanrt.protocol.frame import encode_frame
from wanrt.protocol.limits import MAX_HANDSHAKE_FRAME_BYTES
from wanrt.protocol.messages import MsgType
from wanrt.protocol.params import ParamAnnounce, ParamChunk, ParamRefuse, ParamRequest
from wanrt.protocol.registry import MessageRegistry
from wanrt.protocol.states import EOF, transition_table

EMPTY = SparsePayload.empty(layer=0, dense_len=16, block_size=1)

SAMPLES: dict[int, Message] = {
    MsgType.HELLO: Hello(JOB, "x", "gateway", (1,), bytes(32)),
    MsgType.WELCOME: Welcome(JOB, "x", "gateway", (1,), 1, bytes(32), bytes(32)),
    MsgType.AUTH: Auth(bytes(32)),
    MsgType.REJECT: Reject(1, "no"),
    MsgType.BYE: Bye("done"),
    MsgType.ERROR: Error(1, "boom"),
    MsgType.HEARTBEAT: Heartbeat(1, 0.5),
    MsgType.PUSH: Push(JOB, 1, 0, 0, "x", EMPTY),
    MsgType.AGGREGATE: Aggregate(JOB, 1, 0, 0, "x", EMPTY, ("x",)),
    MsgType.ACK: Ack(1, 0, 0),
    MsgType.PUSH_PIECE: PushPiece(JOB, 1, 0, "x", 0, 16, EMPTY),
    MsgType.AGGREGATE_PIECE: AggregatePiece(JOB, 1, 0, "x", 0, 16, EMPTY),
    MsgType.AGGREGATE_END: AggregateEnd(JOB, 1, 0, 0, "x", 1, ("x",)),
    MsgType.CHUNK: Chunk(1, 0, 10, b"0123"),
    MsgType.CHUNK_CANCEL: ChunkCancel(1),
    MsgType.TELEMETRY: Telemetry("x", 1, {"rate": 1.0}),
    MsgType.CONFIG_UPDATE: ConfigUpdate({"r": 0.01}, 5),
    MsgType.NOTICE: Notice("x", "model", "differs", True, {"model": b"abc"}),
    MsgType.SHARD_REQUEST: ShardRequest(0, 1, 0, 100, 2, False),
    MsgType.SHARD_GRANT: ShardGrant(0, 1, 0, "granted", ((3, 30, 40),)),
    MsgType.SHARD_DONE: ShardDone(0, 0, (3,)),
    MsgType.PARAM_REQUEST: ParamRequest(1, 5, (3, 0)),
    MsgType.PARAM_ANNOUNCE: ParamAnnounce(1, 5, (3, 0), ((5, 1),)),
    MsgType.PARAM_CHUNK: ParamChunk(1, 0, 0, np.ones(3, np.float32)),
    MsgType.PARAM_REFUSE: ParamRefuse(1, "no trainer"),
}


def test_samples_cover_the_core_registry() -> None:
    assert set(SAMPLES) == set(CORE_REGISTRY.types)


def raw_frame(msg: Message) -> bytes:
    header, buffers = msg.to_wire()
    return b"".join(encode_frame(1, msg.TYPE, header, buffers))


def pair_in(state: State) -> Pair:
    pair = make_pair()
    if state is State.START:
        return pair
    pair.c2s(pair.client.hello())
    if state is State.HELLO:
        return pair
    pair.s2c(pair.server.accept())
    if state is State.WELCOME:
        return pair
    pair.c2s(pair.client.authenticate())
    if state is State.AUTHENTICATED:
        return pair
    pair.send(pair.client, Heartbeat(0, 0.0))
    if state is State.STREAMING:
        return pair
    closer = pair.client if state is State.CLOSING_BY_CLIENT else pair.server
    pair.send(closer, Bye())
    return pair


LIVE = [s for s in State if s not in (State.CLOSED, State.ERROR)]


@pytest.mark.parametrize("state", LIVE)
@pytest.mark.parametrize("sender", list(Side))
@pytest.mark.parametrize("code", sorted(SAMPLES))
def test_receiving_any_type_in_any_state_follows_the_table(state: State, sender: Side, code: int) -> None:
    pair = pair_in(state)
    receiver = pair.server if sender is Side.CLIENT else pair.client
    assert receiver.state is state
    allowed = (sender, state, code) in receiver._table
    try:
        feed(receiver, raw_frame(SAMPLES[code]))
    except (RemoteProtocolError, AuthError) as exc:
        assert receiver.state is State.ERROR
        # allowed combinations may still fail (forged proofs, a garbage chunk) but never on the state rule
        assert ("may not send" in str(exc)) is not allowed, str(exc)
    else:
        assert allowed
        assert receiver.state is transition_table(CORE_REGISTRY.stream_types)[(sender, state, code)]


@pytest.mark.parametrize("state", LIVE)
@pytest.mark.parametrize("code", sorted(SAMPLES))
def test_sending_any_type_in_any_state_follows_the_table(state: State, code: int) -> None:
    for side in Side:
        pair = pair_in(state)
        conn = pair.client if side is Side.CLIENT else pair.server
        if (side, state, code) in conn._table:
            continue  # allowed sends are exercised by the handshake and round-trip tests
        with pytest.raises(LocalProtocolError, match="may not send"):
            conn.send(SAMPLES[code])
        assert conn.state is State.ERROR


def test_push_before_authentication_is_refused_from_its_fixed_header() -> None:
    push = authenticated_pair().client.send(Push(JOB, 1, 0, 0, "x", EMPTY))
    for state in (State.START, State.HELLO, State.WELCOME):
        pair = pair_in(state)
        pair.server.receive_data(push[:24])
        with pytest.raises(RemoteProtocolError, match="may not send Push"):
            pair.server.next_event()


def test_bye_is_a_half_close() -> None:
    pair = authenticated_pair()
    assert pair.send(pair.client, Bye("draining")) == [Bye("draining")]
    assert pair.server.state is State.CLOSING_BY_CLIENT
    # the server finishes what it was sending; the client still receives it
    p = SparsePayload.from_dense_blocks(0, np.arange(32, dtype=np.float32), np.array([1]), 16)
    (agg,) = pair.send(pair.server, Aggregate(JOB, 1, 0, 0, "gw-a", p, ("site-a", "site-b")))
    assert isinstance(agg, Aggregate) and agg.sites == ("site-a", "site-b")
    # ... but the client said it sends nothing more
    with pytest.raises(LocalProtocolError):
        pair.client.send(Ack(1, 0, 0))
    pair = authenticated_pair()
    pair.send(pair.client, Bye())
    pair.send(pair.server, Bye("ok"))
    assert pair.client.state is State.CLOSED and pair.server.state is State.CLOSED
    assert pair.client.next_event() == ConnectionClosed(clean=True, reason="ok")
    with pytest.raises(LocalProtocolError):
        pair.client.send(Heartbeat(1, 1.0))


def test_frames_after_the_peers_bye_are_violations() -> None:
    pair = authenticated_pair()
    blob = pair.client.send(Bye()) + raw_frame(Heartbeat(1, 1.0))
    with pytest.raises(RemoteProtocolError):
        feed(pair.server, blob)


def test_eof_between_frames_is_an_unclean_close_and_mid_frame_is_an_error() -> None:
    pair = authenticated_pair()
    (ev,) = feed(pair.server, b"")
    assert ev == ConnectionClosed(clean=False, reason="peer closed the connection without Bye")
    assert pair.server.state is State.CLOSED
    assert pair.server.next_event() == ev  # repeatedly
    pair.server.receive_data(b"ignored once closed")
    pair = authenticated_pair()
    frame = raw_frame(Heartbeat(1, 1.0))
    with pytest.raises(RemoteProtocolError, match="middle of a frame"):
        feed(pair.server, frame[:-1] + b"")
        feed(pair.server, b"")
    with pytest.raises(LocalProtocolError):
        pair.server.next_event()
    pair.server.receive_data(b"dropped in ERROR")
    pair = make_pair()
    pair.server.receive_data(b"")
    with pytest.raises(LocalProtocolError):
        pair.server.receive_data(b"after eof")


def test_error_message_closes_the_connection() -> None:
    pair = authenticated_pair()
    (err,) = pair.send(pair.server, Error(7, "out of memory"))[:1]
    assert err == Error(7, "out of memory") and pair.client.state is State.CLOSED
    assert pair.client.next_event() == ConnectionClosed(clean=True, reason="out of memory")


def test_frame_checks_after_negotiation() -> None:
    for patch, match in (
        (lambda f: f[:4] + b"\x02" + f[5:], "version"),
        (lambda f: f[:5] + b"\x77" + f[6:], "unknown message type"),
        (lambda f: f[:6] + b"\x00\x01" + f[8:], "flag"),
    ):
        pair = authenticated_pair()
        with pytest.raises(RemoteProtocolError, match=match):
            feed(pair.server, patch(raw_frame(Ack(1, 1, 1))))


def test_frames_without_buffers_may_not_announce_a_body() -> None:
    pair = authenticated_pair()
    head = bytearray(raw_frame(Ack(1, 1, 1)))
    struct.pack_into("!I", head, 16, 8)
    with pytest.raises(RemoteProtocolError, match="no body"):
        feed(pair.server, bytes(head[:24]))


def test_handshake_frames_are_held_to_the_small_pre_auth_limit() -> None:
    pair = make_pair()
    head = bytearray(pair.client.hello()[:24])
    struct.pack_into("!I", head, 16, MAX_HANDSHAKE_FRAME_BYTES)
    with pytest.raises(LimitExceeded):
        feed(pair.server, bytes(head))


def test_a_smaller_configured_frame_limit_is_enforced_and_advertised() -> None:
    from wanrt.protocol import ProtocolConfig

    small = ProtocolConfig(max_frame_bytes=64 * 1024, max_reassembly_bytes=64 * 1024)
    pair = authenticated_pair(server_config=small)
    assert pair.client.peer_max_frame == 64 * 1024
    n = 32 * 1024
    big = SparsePayload(0, n, 1, np.arange(n, dtype=np.int64), np.ones(n, np.float32))
    with pytest.raises(LocalProtocolError, match="frame limit"):
        pair.client.send_parts(Push(JOB, 1, 0, 0, "x", big))
    # a peer that ignores the advertised limit is refused from the fixed header
    rogue = authenticated_pair()
    frame = rogue.client.send(Push(JOB, 1, 0, 0, "x", big))
    pair = authenticated_pair(server_config=small)
    with pytest.raises(LimitExceeded):
        feed(pair.server, frame[:24])


@dataclass(frozen=True, slots=True)
class PlanUpdate(Message):
    """A scheduler message living in the scheduler range."""

    TYPE: ClassVar[int] = 0x40
    STREAM: ClassVar[bool] = True
    epoch: int

    def __post_init__(self) -> None:
        check_uint(self.epoch, "epoch", 2**32)


def test_scheduler_messages_register_without_touching_the_core_registry() -> None:
    reg = CORE_REGISTRY.with_messages(PlanUpdate)
    assert CORE_REGISTRY.get(0x40) is None and reg.get(0x40) is PlanUpdate
    kw: dict[str, Any] = {"side": "client", "registry": reg}
    pair = make_pair()
    pair.client = Connection("scheduler", "sched", JOB, pair.client._secret, **kw)
    pair.server = Connection("gateway", "gw", JOB, pair.client._secret, side="server", registry=reg)
    pair.handshake()
    assert pair.send(pair.client, PlanUpdate(3)) == [PlanUpdate(3)]
    core_only = authenticated_pair()
    with pytest.raises(RemoteProtocolError, match="unknown message type"):
        feed(core_only.server, raw_frame(PlanUpdate(3)))
    with pytest.raises(LocalProtocolError):
        core_only.client.send(PlanUpdate(3))
    with pytest.raises(LocalProtocolError):
        CORE_REGISTRY.with_messages(Ack)  # core range / duplicate code
    with pytest.raises(LocalProtocolError):
        MessageRegistry([PlanUpdate, PlanUpdate])


def test_table_routes_eof_and_error_from_every_live_state() -> None:
    table = transition_table(CORE_REGISTRY.stream_types)
    for side in Side:
        for state in LIVE:
            assert table[(side, state, EOF)] is State.CLOSED
            assert table[(side, state, MsgType.ERROR)] is State.CLOSED
    assert not any(key[1] in (State.CLOSED, State.ERROR) for key in table)
