"""The fake gateway's sparse sum is the dense fp32 sum bit for bit (the client tests compare trainers'
parameters against it exactly)."""

from __future__ import annotations

import numpy as np

from tools.harness.fake_gateway import exact_sum
from wanrt.payload import SparsePayload


def _dense_sum(parts: list[SparsePayload]) -> SparsePayload:
    first = parts[0]
    dense = np.zeros(first.dense_len, np.float32)
    for p in parts:
        p.add_into(dense)
    blocks = np.unique(np.concatenate([p.indices for p in parts]))
    return SparsePayload.from_dense_blocks(first.layer, dense, blocks, first.block_size)


def test_sparse_sum_equals_the_dense_sum_bit_for_bit() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        bs = int(rng.choice([1, 4, 16]))
        n = int(rng.integers(1, 400))
        nb = -(-n // bs)
        parts = []
        for _ in range(int(rng.integers(1, 4))):
            idx = np.sort(rng.choice(nb, int(rng.integers(0, nb + 1)), replace=False)).astype(np.int64)
            dense = (rng.standard_normal(n) * rng.choice([1e-3, 1.0, 1e3])).astype(np.float32)
            dense[rng.random(n) < 0.1] = -0.0  # 0.0 + -0.0 must come out as the dense sum does
            parts.append(SparsePayload.from_dense_blocks(3, dense, idx, bs))
        got, want = exact_sum(parts), _dense_sum(parts)
        assert got.dense_len == want.dense_len and got.block_size == want.block_size
        assert got.indices.tobytes() == want.indices.tobytes()
        assert got.values.tobytes() == want.values.tobytes()
