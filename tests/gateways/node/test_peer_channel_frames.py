"""Which frames a round message becomes on a link: one RoundData when it fits a chunk, tag + Push when
not; either way the peer's channel hands its node the same RoundMsg and acknowledges it."""

from __future__ import annotations

import itertools

import numpy as np

from gateways.node.peer_channel import PeerChannel
from gateways.sending.edf_queue import EdfQueue
from gateways.sending.link_times import LinkTimes
from gateways.sending.pacer import Pacer
from gateways.stats import LinkCounters
from tests.wanrt.protocol.peer.gateway_pair import gateway_pair
from wanrt.payload import SparsePayload
from wanrt.protocol import Ack, Connection, Push
from wanrt.protocol.frame import FrameReader, parse_fixed_header
from wanrt.protocol.peer.round_frames import GATEWAY_REGISTRY, RoundData, RoundTag
from wanrt.protocol.peer.round_msg import RoundMsg

SECRET = b"peer-channel-test-secret"


def _channels(chunk_bytes: int) -> tuple[PeerChannel, PeerChannel]:
    c, s = gateway_pair(SECRET)

    def channel(conn: Connection, peer: str) -> PeerChannel:
        return PeerChannel(
            0,
            peer,
            conn,
            queue=EdfQueue(chunk_bytes=chunk_bytes, coalesce_bytes=1024),
            item_ids=itertools.count(),
            pacer=Pacer(1e12, 0.0),
            link_times=LinkTimes(3),
            counters=LinkCounters(),
            now=0.0,
        )

    return channel(c, "b"), channel(s, "a")


def _payload(n_blocks: int) -> SparsePayload:
    rng = np.random.default_rng(n_blocks)
    idx = np.sort(rng.choice(4 * n_blocks, size=n_blocks, replace=False)).astype(np.int64)
    return SparsePayload(2, 64 * n_blocks, 16, idx, rng.standard_normal(16 * n_blocks).astype(np.float32))


def _frame_types(data: bytes) -> list[int]:
    reader = FrameReader()
    reader.feed(data)
    out = []
    while (frame := reader.next_frame(lambda fixed: None)) is not None:
        out.append(frame.msg_type)
    return out


def _send(a: PeerChannel, msg: RoundMsg) -> bytes:
    a.send_round(msg)
    data = b""
    while (out := a.poll(0.0)).parts:
        data += b"".join(out.parts)
    return data


def test_a_small_message_is_one_frame_a_large_one_a_tag_and_a_push() -> None:
    a, b = _channels(chunk_bytes=64 << 10)
    small = RoundMsg("partial", 4, 2, 1, _payload(8), (("a", 4),))
    large = RoundMsg("final", 4, 2, 1, _payload(2048), (("a", 4), ("b", 4)))  # 160 KiB raw > a chunk
    data = _send(a, small)
    assert _frame_types(data) == [RoundData.TYPE]
    (ev,) = list(b.receive(data, 0.0))
    assert type(ev) is RoundData
    got = b.on_data(ev)
    assert got.payload is not None and small.payload is not None
    assert (got.payload.indices == small.payload.indices).all()
    assert got.payload.values.tobytes() == small.payload.values.tobytes()
    b.taken(ev)

    data = _send(a, large)
    types = _frame_types(data)
    assert types[0] == RoundTag.TYPE and RoundData.TYPE not in types and len(types) > 2  # chunked Push
    events = list(b.receive(data, 0.0))
    assert [type(e) for e in events] == [RoundTag, Push]
    assert isinstance(events[0], RoundTag) and isinstance(events[1], Push)
    assert b.on_tag(events[0]) is None
    tag, got = b.on_payload(events[1])
    assert got.payload is not None and large.payload is not None
    assert got.payload.values.tobytes() == large.payload.values.tobytes()
    b.taken(tag)
    b.flush_ack()  # one cumulative ack for both messages, whatever their form
    acks = list(a.receive(_send(b, RoundMsg("outcome", 5, 2, 1, None, ())), 0.0))
    assert any(type(e).__name__ == "Ack" and a.acked_seq(e) == 1 for e in acks)  # type: ignore[arg-type]
    assert [e for e in acks if type(e).__name__ == "Ack"] == [Ack(4, 2, 1)]  # (iteration, layer, round)


def test_the_fixed_header_of_round_data_is_a_registered_gateway_type() -> None:
    a, _ = _channels(chunk_bytes=64 << 10)
    data = _send(a, RoundMsg("partial", 1, 2, 1, _payload(4), (("a", 1),)))
    fixed = parse_fixed_header(data[:24])
    assert GATEWAY_REGISTRY.get(fixed.msg_type) is RoundData
