"""Hypothesis strategies for every message type, with payloads of every dtype and block size."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from hypothesis import strategies as st

from wanrt.payload import SparsePayload, fp32_to_bf16, n_blocks
from wanrt.protocol import (
    Ack,
    Aggregate,
    Bye,
    Chunk,
    ChunkCancel,
    ConfigUpdate,
    Error,
    Heartbeat,
    Message,
    Push,
    Reject,
    Telemetry,
)
from wanrt.protocol.limits import MAX_COUNTER, MAX_LAYER_ID

DTYPES = ("fp32", "fp16", "bf16")
BLOCK_SIZES = (1, 2, 4, 16, 32)

names = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.:@+-]{0,15}", fullmatch=True)
counters = st.integers(0, MAX_COUNTER)
layer_ids = st.integers(0, MAX_LAYER_ID)
finite = st.floats(allow_nan=False, allow_infinity=False)
info_values = st.one_of(
    st.integers(-(2**63), 2**64 - 1), finite, st.text(max_size=20), st.binary(max_size=20), st.booleans()
)
infos = st.dictionaries(names, info_values, max_size=6)


@st.composite
def payloads(draw: st.DrawFn, layer: int | None = None) -> SparsePayload:
    dtype = draw(st.sampled_from(DTYPES))
    bs = draw(st.sampled_from(BLOCK_SIZES))
    dense_len = draw(st.integers(0, 400))
    nb = n_blocks(dense_len, bs)
    chosen = sorted(draw(st.sets(st.integers(0, nb - 1), max_size=nb))) if nb else []
    seed = draw(st.integers(0, 2**32 - 1))
    dense = np.random.default_rng(seed).standard_normal(dense_len).astype(np.float32)
    lay = draw(layer_ids) if layer is None else layer
    p = SparsePayload.from_dense_blocks(lay, dense, np.array(chosen, dtype=np.int64), bs)
    if dtype == "fp16":
        return SparsePayload(lay, dense_len, bs, p.indices, p.values.astype(np.float16), "fp16")
    if dtype == "bf16":
        return SparsePayload(lay, dense_len, bs, p.indices, fp32_to_bf16(p.values), "bf16")
    return p


@st.composite
def pushes(draw: st.DrawFn) -> Push:
    layer = draw(layer_ids)
    return Push(draw(names), draw(counters), layer, draw(layer_ids), draw(names), draw(payloads(layer)))


@st.composite
def aggregates(draw: st.DrawFn) -> Aggregate:
    layer = draw(layer_ids)
    sites = tuple(draw(st.lists(names, min_size=1, max_size=8, unique=True)))
    return Aggregate(
        draw(names), draw(counters), layer, draw(layer_ids), draw(names), draw(payloads(layer)), sites
    )


@st.composite
def chunks(draw: st.DrawFn) -> Chunk:
    data = draw(st.binary(min_size=1, max_size=300))
    offset = draw(st.integers(0, 1000))
    total = offset + len(data) + draw(st.integers(0, 1000))
    return Chunk(draw(counters), offset, total, data)


config_values = st.one_of(st.integers(-(2**63), 2**63 - 1), finite, st.text(max_size=30), st.booleans())

#: Every message that may be sent after authentication.
stream_messages: st.SearchStrategy[Message] = st.one_of(
    st.builds(Heartbeat, counters, finite),
    pushes(),
    aggregates(),
    st.builds(Ack, counters, layer_ids, layer_ids),
    chunks(),
    st.builds(ChunkCancel, counters),
    st.builds(Telemetry, names, counters, st.dictionaries(names, finite, max_size=10)),
    st.builds(ConfigUpdate, st.dictionaries(names, config_values, max_size=10), counters),
)

session_end_messages: st.SearchStrategy[Message] = st.one_of(
    st.builds(Bye, st.text(max_size=50)),
    st.builds(Error, st.integers(0, 0xFFFF), st.text(max_size=50)),
    st.builds(
        Reject,
        st.integers(0, 0xFFFF),
        st.text(max_size=50),
        st.lists(st.integers(1, 255), max_size=5, unique=True).map(tuple),
    ),
)


def assert_same_message(a: Message, b: Message) -> None:
    """Equality for messages whose payload compares by identity (SparsePayload has no value equality)."""
    assert type(a) is type(b)
    if isinstance(a, Push):
        assert isinstance(b, Push)
        pa, pb = a.payload, b.payload
        assert (pa.layer, pa.dense_len, pb.block_size, pa.value_dtype) == (
            pb.layer,
            pb.dense_len,
            pb.block_size,
            pb.value_dtype,
        )
        np.testing.assert_array_equal(pa.indices, pb.indices)
        assert pa.values.dtype == pb.values.dtype
        assert pa.values.tobytes() == pb.values.tobytes()
        names = [f.name for f in dataclasses.fields(a) if f.name != "payload"]
        fields_a: dict[str, Any] = {k: getattr(a, k) for k in names}
        fields_b: dict[str, Any] = {k: getattr(b, k) for k in names}
        assert fields_a == fields_b
    else:
        assert a == b
