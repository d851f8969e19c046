"""Pay the payload codec's one-time start-up cost before the gateway takes part in any round.

The codec's fused kernels (numba) are compiled, or loaded from numba's disk cache, on their first call: a
pause of a second or more on a loaded machine. If that first call happens inside the first round, the whole
event loop stalls with it, heartbeats stop, and the peers declare this gateway lost for nothing. So the
daemon encodes and decodes a few synthetic payloads, covering every value dtype and index encoding, once at
start-up, before it listens.
"""

from __future__ import annotations

from typing import get_args

import numpy as np

from wanrt import codec
from wanrt.codec.index_encodings import IndexEncoding
from wanrt.payload import VALUE_DTYPES, SparsePayload

__all__ = ["warm_up_codec"]


def warm_up_codec() -> None:
    """Encode and decode one small payload per (value dtype, index encoding)."""
    dense = np.arange(1, 4097, dtype=np.float32)
    for index in get_args(IndexEncoding):
        for dtype in VALUE_DTYPES:
            p = SparsePayload.from_dense_blocks(0, dense, np.array([0, 3, 700, 1023]), 4)
            meta, buffers = codec.encode_payload(p, wire_dtype=dtype, index_encoding=index)
            codec.decode_payload(meta, [memoryview(b) for b in buffers])
