"""Small layers and payloads whose fp32 sums are exact in any order (small integer values).

For accounting checks: a lost or doubled push shows in the sum of the delivered results, bit for bit,
whatever order the gateways added them in. Used by the round-engine test harness and the chaos soak;
drawn from a small per-(site, layer) pool, since generating a fresh payload per push would dominate them.
"""

from __future__ import annotations

import functools
import zlib

import numpy as np

from wanrt.payload import SparsePayload, n_blocks

__all__ = ["layer_shape", "make_payload"]

_POOL = 7


def layer_shape(layer: int) -> tuple[int, int]:
    """Small layers of varied shape (dense length, block size): element-wise and cache-aware blocks."""
    return 37 + 23 * layer, (16 if layer % 3 == 0 else (4 if layer % 3 == 1 else 1))


@functools.lru_cache(maxsize=4096)
def _payload_pool(site: str, layer: int, density: float) -> tuple[SparsePayload, ...]:
    dense_len, bs = layer_shape(layer)
    rng = np.random.default_rng(zlib.crc32(f"{site}/{layer}".encode()))
    nb = n_blocks(dense_len, bs)
    out = []
    for _ in range(_POOL):
        idx = np.flatnonzero(rng.random(nb) < density).astype(np.int64)
        dense = rng.integers(-4, 5, size=dense_len).astype(np.float32)
        out.append(SparsePayload.from_dense_blocks(layer, dense, idx, bs))
    return tuple(out)


def make_payload(site: str, iteration: int, layer: int, density: float = 0.3) -> SparsePayload:
    """A deterministic payload of ``site`` for (``iteration``, ``layer``)."""
    return _payload_pool(site, layer, density)[iteration % _POOL]
