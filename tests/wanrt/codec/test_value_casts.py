"""``in_wire_dtype``: the trainer client's cast is the codec's cast (same bytes, same overflow policy)."""

from __future__ import annotations

import numpy as np
import pytest

from wanrt.codec import encode_payload
from wanrt.codec.value_casts import in_wire_dtype
from wanrt.payload import SparsePayload


def payload_with(extra: float) -> SparsePayload:
    dense = np.linspace(-3.0, 3.0, 64, dtype=np.float32)
    dense[5] = extra
    dense[6] = 1e-6  # an fp16 subnormal
    return SparsePayload.from_dense_blocks(2, dense, np.array([0, 1, 3]), 16)


@pytest.mark.parametrize("wire", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("extra", [1.0, 65504.0, 65519.0, 65520.0, 1e30, float("inf"), float("nan")])
def test_cast_payload_encodes_to_the_bytes_the_codec_sends(wire: str, extra: float) -> None:
    p = payload_with(extra)
    q = in_wire_dtype(p, wire)
    direct_meta, direct = encode_payload(p, wire_dtype=wire)
    cast_meta, cast = encode_payload(q)  # in its own dtype: what the client's Push carries
    assert cast_meta == direct_meta
    assert [bytes(b) for b in cast] == [bytes(b) for b in direct]
    q.validate()


def test_fp16_overflow_keeps_the_payload_and_same_dtype_is_no_copy() -> None:
    big = payload_with(65520.0)  # rounds to inf in fp16: the codec keeps fp32
    assert in_wire_dtype(big, "fp16") is big
    fits = payload_with(65519.0)  # rounds to 65504: sent as fp16
    assert in_wire_dtype(fits, "fp16").value_dtype == "fp16"
    assert in_wire_dtype(fits, "fp32") is fits
