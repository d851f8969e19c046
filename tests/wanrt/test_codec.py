"""Round trips and lying payloads for wanrt.codec (encode_payload / decode_payload)."""

from __future__ import annotations

import numpy as np

from wanrt.codec import decode_payload, encode_payload
from wanrt.payload import SparsePayload


def test_block16_fp32_round_trip_is_exact_and_zero_copy() -> None:
    rng = np.random.default_rng(1)
    idx = np.array([0, 5, 9, 200], dtype=np.int64)
    p = SparsePayload(7, 3300, 16, idx, rng.standard_normal(64).astype(np.float32))
    meta, bufs = encode_payload(p)
    assert np.shares_memory(np.frombuffer(bufs[0], np.uint8), p.values)
    q = decode_payload(meta, bufs, peer="t")
    np.testing.assert_array_equal(q.indices, idx)
    np.testing.assert_array_equal(q.values.view(np.uint32), p.values.view(np.uint32))
    assert np.shares_memory(q.values, np.frombuffer(bufs[0], np.uint8))
