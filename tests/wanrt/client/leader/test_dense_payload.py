"""The leader's dense payload is cast once, from the gradient, and owns its values; the update's average is
bit-identical to the fp32 product the step always applied."""

from __future__ import annotations

import numpy as np
import pytest

from wanrt.client.config import ClientConfig
from wanrt.client.leader.compression import LayerCompressor
from wanrt.client.site.decision import SiteUpdate
from wanrt.client.site.update_apply import UpdateApplier
from wanrt.codec.value_casts import in_wire_dtype
from wanrt.payload import SparsePayload, n_blocks


def _grad(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32) * 3


@pytest.mark.parametrize("wire", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("n", [4096, 4096 + 5])
def test_dense_payload_equals_gather_then_cast(wire: str, n: int) -> None:
    g = _grad(n)
    lc = LayerCompressor(ClientConfig(density=1.0, wire_dtype=wire))  # type: ignore[arg-type]
    got = lc.compress(3, g)
    blocks = np.arange(n_blocks(n, 16), dtype=np.int64)
    want = in_wire_dtype(SparsePayload.from_dense_blocks(3, g, blocks, 16), wire)
    assert got.value_dtype == want.value_dtype
    assert np.array_equal(got.indices, want.indices)
    assert got.values.tobytes() == want.values.tobytes()
    assert not np.shares_memory(got.values, g)  # a link may keep it while the gradient memory is reused
    g[:] = 0  # the caller reuses its gradient: the payload does not change
    assert got.values.tobytes() == want.values.tobytes()


def test_dense_fp16_overflow_keeps_fp32_copy() -> None:
    g = _grad(1024)
    g[7] = 1e6  # beyond fp16: the codec sends the payload in fp32 rather than clamp it
    got = LayerCompressor(ClientConfig(density=1.0, wire_dtype="fp16")).compress(0, g)
    assert got.value_dtype == "fp32"
    assert np.array_equal(got.values, g)
    assert not np.shares_memory(got.values, g)


@pytest.mark.parametrize("dtype", ["fp16", "fp32", "bf16"])
@pytest.mark.parametrize("sites", [1, 2, 3, 7])
def test_average_bit_identical_to_fp32_product(dtype: str, sites: int) -> None:
    n = 16 * 257
    f32 = _grad(n, seed=sites)
    p32 = SparsePayload(0, n, 16, np.arange(257, dtype=np.int64), f32, "fp32")
    p = in_wire_dtype(p32, dtype)
    if dtype == "fp16":  # received payloads are read-only views of the frame
        p.values.flags.writeable = False
    applier = UpdateApplier()
    for _ in range(2):  # the buffer is reused on the second call
        got = applier.averaged(SiteUpdate(0, 0, sites, p))
        want = (p.values_f32() * np.float32(1.0 / sites)).astype(np.float32, copy=False)
        assert got.dtype == np.float32
        assert got.tobytes() == want.tobytes()
