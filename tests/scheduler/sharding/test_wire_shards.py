"""Shard messages on both links: they survive the wire unchanged, and a peer's out-of-bounds fields are its
fault (RemoteProtocolError / LimitExceeded) before anything is allocated for them."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from wanrt.errors import LimitExceeded, LocalProtocolError, RemoteProtocolError
from wanrt.protocol import CORE_REGISTRY, Message, ShardDone, ShardGrant, ShardRequest
from wanrt.protocol.messages import decode_message
from wanrt.protocol.scheduler.messages import (
    SCHEDULER_REGISTRY,
    SiteShardDone,
    SiteShardGrant,
    SiteShardRelease,
    SiteShardRequest,
)

SAMPLES: list[Message] = [
    ShardRequest(1, 2, 3, 1000, 4, True),
    ShardGrant(1, 2, 3, "granted", ((5, 50, 60), (6, 60, 70))),
    ShardGrant(1, 2, 3, "drained", ()),
    ShardDone(1, 3, (5, 6)),
    SiteShardRequest("a", 1, 2, 3, 1000, 4, False),
    SiteShardGrant("a", 1, 2, 3, "granted", ((5, 50, 60),)),
    SiteShardDone("a", 1, 3, (5,)),
    SiteShardRelease("a", "trainer left"),
]


def _wire(msg: Message) -> dict[str, Any]:
    header, _ = msg.to_wire()
    out: dict[str, Any] = msgpack.unpackb(msgpack.packb(header), use_list=False)
    return out


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip(msg: Message) -> None:
    assert decode_message(type(msg), _wire(msg), []) == msg
    registry = SCHEDULER_REGISTRY if type(msg).TYPE >= 0x40 else CORE_REGISTRY
    assert registry.get(type(msg).TYPE) is type(msg)


@pytest.mark.parametrize(
    ("cls", "fields", "error"),
    [
        (ShardGrant, {"shards": tuple((i, i * 10, i * 10 + 10) for i in range(65))}, LimitExceeded),
        (ShardGrant, {"shards": ((1, 10, 10),)}, RemoteProtocolError),
        (ShardGrant, {"shards": ((1, 10),)}, RemoteProtocolError),
        (ShardGrant, {"status": "granted", "shards": ()}, RemoteProtocolError),
        (ShardGrant, {"status": "maybe"}, RemoteProtocolError),
        (ShardDone, {"shards": ()}, RemoteProtocolError),
        (ShardDone, {"shards": (-1,)}, RemoteProtocolError),
        (ShardRequest, {"want": 0}, RemoteProtocolError),
        (ShardRequest, {"rank": 1 << 20}, RemoteProtocolError),
        (ShardRequest, {"dataset_len": 1 << 41}, RemoteProtocolError),
        (ShardRequest, {"fresh": 1}, RemoteProtocolError),
        (SiteShardRequest, {"site": "../etc"}, RemoteProtocolError),
    ],
)
def test_hostile_fields_are_the_peer_s_fault(cls: type[Message], fields: dict[str, Any], error: type) -> None:
    base = next(m for m in SAMPLES if type(m) is cls)
    header = {**_wire(base), **fields}
    if cls is ShardGrant and "status" not in fields:
        header["status"] = "granted"
    with pytest.raises(error):
        decode_message(cls, header, [])
    with pytest.raises(LocalProtocolError):  # and we cannot build it either
        cls(**header)
