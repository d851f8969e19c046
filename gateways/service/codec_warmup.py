"""The payload codec's start-up work, done before the gateway takes part in any round.

What is *not* done here any more: loading the fused (numba) kernels. They cost ~130 MB of resident memory
and seconds of CPU per process, and pay only for large payloads, so the codec loads them itself, in a
background thread, when it first meets a payload of at least :data:`~wanrt.codec.kernel_choice.
FUSED_MIN_VALUES` value slots, and serves that payload (and any other large one until the kernels are
compiled) with the bit-identical NumPy path. So a gateway that relays small payloads never loads numba,
and one that relays large ones never stalls a round (and its heartbeats) on a compile. Design and
measurement: :mod:`wanrt.codec.kernel_choice`, docs/codec.md.

What is left: one encode and decode per (value dtype, index encoding) of a small payload, so the codec's
modules and msgpack are imported and their first-call costs paid here rather than in the first round.
With ``WANRT_KERNELS=fused`` the fused kernels are forced for every payload, and this is where they
compile.
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
            idx = np.arange(4) if index == "run" else np.array([0, 3, 700, 1023])  # a run is contiguous
            p = SparsePayload.from_dense_blocks(0, dense, idx, 4)
            meta, buffers = codec.encode_payload(p, wire_dtype=dtype, index_encoding=index)
            codec.decode_payload(meta, [memoryview(b) for b in buffers])
