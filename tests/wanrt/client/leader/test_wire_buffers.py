"""A large dense layer's wire values are cast into a buffer the leader reuses, but only once nothing else
(the payload, a view of it, a frame's memoryview, the link's unacknowledged push) holds that buffer."""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest

from wanrt.client.config import ClientConfig
from wanrt.client.leader.compression import LayerCompressor
from wanrt.client.leader.wire_buffers import KEEP_PER_LAYER, WireBuffers
from wanrt.codec.kernel_choice import codec_kernels
from wanrt.codec.value_casts import in_wire_dtype
from wanrt.errors import ConfigError, KernelError
from wanrt.payload import SparsePayload, n_blocks
from wanrt.protocol import Push

N = 16 * 4096  # 64 K elements: 128 KB of fp16


def _grad(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(N).astype(np.float32)


def _lc(wire: str = "fp16", min_bytes: int = 1024) -> LayerCompressor:
    return LayerCompressor(ClientConfig(density=1.0, wire_dtype=wire, reuse_wire_buffer_bytes=min_bytes))  # type: ignore[arg-type]


def _want(g: np.ndarray, wire: str) -> bytes:
    blocks = np.arange(n_blocks(N, 16), dtype=np.int64)
    return in_wire_dtype(SparsePayload(0, N, 16, blocks, g.copy(), "fp32"), wire).values.tobytes()


@pytest.mark.parametrize("wire", ["fp16", "bf16", "fp32"])
def test_released_buffer_is_reused_and_holds_the_new_cast(wire: str) -> None:
    lc = _lc(wire)
    first = lc.compress(0, _grad(1))
    first_ptr = first.values.ctypes.data
    del first
    gc.collect()
    second = lc.compress(0, _grad(2))
    assert second.values.ctypes.data == first_ptr  # the same memory, written again
    assert lc.buffers.reused == 1
    assert second.values.tobytes() == _want(_grad(2), wire)


def test_buffer_held_by_payload_view_or_frame_is_never_overwritten() -> None:
    lc = _lc()
    held = lc.compress(0, _grad(1))
    before = held.values.tobytes()
    view = held.values[5:9]  # what a cut push piece keeps
    mv = held.values.view(np.uint8).data  # what an encoded frame keeps
    second = lc.compress(0, _grad(2))  # the second kept buffer
    third = lc.compress(0, _grad(3))  # both busy: a fresh array
    assert not np.shares_memory(second.values, held.values)
    assert not np.shares_memory(third.values, held.values)
    assert not np.shares_memory(third.values, second.values)
    assert held.values.tobytes() == before
    assert third.values.tobytes() == _want(_grad(3), "fp16")
    del held
    gc.collect()
    fourth = lc.compress(0, _grad(4))  # the view and the memoryview still hold the first buffer
    assert not np.shares_memory(fourth.values, view)
    assert bytes(mv[:8]) == before[:8]
    assert lc.buffers.reused == 0


def test_push_message_holds_its_buffer_until_dropped() -> None:
    lc = _lc()
    p = lc.compress(0, _grad(1))
    push = Push("job", 0, 0, 0, "a", p)  # the link keeps this until the gateway acknowledges it
    del p
    gc.collect()
    q = lc.compress(0, _grad(2))
    assert not np.shares_memory(q.values, push.payload.values)
    del push, q
    gc.collect()
    lc.compress(0, _grad(3))
    assert lc.buffers.reused == 1


def test_small_layers_and_zero_threshold_allocate_as_before() -> None:
    for lc in (_lc(min_bytes=1 << 30), _lc(min_bytes=0)):
        for seed in range(3):
            p = lc.compress(0, _grad(seed))
            assert p.values.tobytes() == _want(_grad(seed), "fp16")
            del p
        assert lc.buffers.reused == 0


def test_pool_keeps_at_most_two_per_layer_and_follows_a_shape_change() -> None:
    wb = WireBuffers(1)
    held = [wb.take(0, 100, np.float16) for _ in range(KEEP_PER_LAYER)]
    assert all(b is not None for b in held)
    assert wb.take(0, 100, np.float16) is None  # both busy (the caller allocates)
    other = wb.take(0, 50, np.float16)  # the layer changed length: the old ones are dropped
    assert other is not None and other.shape == (50,)
    assert wb.take(1, 100, np.float16) is not None  # layers are independent


def test_fp16_overflow_falls_back_to_fp32_copy_in_a_buffer() -> None:
    lc = _lc()
    g = _grad(1)
    g[3] = 1e6
    p = lc.compress(0, g)
    assert p.value_dtype == "fp32"
    assert np.array_equal(p.values, g)
    assert not np.shares_memory(p.values, g)


@pytest.mark.parametrize("mode", ["numpy", "fused"])
def test_cast_into_out_equals_fresh_cast(mode: str) -> None:
    try:
        k = codec_kernels(mode)
    except KernelError:
        pytest.skip("no numba here")
    values = _grad(5)
    values[7] = 1e6  # an fp16 overflow is still reported when writing into out
    out16, out_b = np.full(N, 7, np.float16), np.full(N, 7, np.uint16)
    fresh, over = k.f32_to_f16(values)
    got, over_out = k.f32_to_f16(values, out16)
    assert over and over_out
    assert np.shares_memory(got, out16)
    values[7] = 1.0
    fresh, over = k.f32_to_f16(values)
    got, over_out = k.f32_to_f16(values, out16)
    assert not over and not over_out and got.tobytes() == fresh.tobytes()
    got_b = k.f32_to_bf16(values, out_b)
    assert np.shares_memory(got_b, out_b) and got_b.tobytes() == k.f32_to_bf16(values).tobytes()


@pytest.mark.parametrize("bad", ["short", "strided", "readonly", "wide"])
def test_cast_output_is_checked(bad: str) -> None:
    values = _grad(1)
    out: Any = {
        "short": np.empty(N - 1, np.float16),
        "strided": np.empty(2 * N, np.float16)[::2],
        "readonly": np.empty(N, np.float16),
        "wide": np.empty(N, np.float32),
    }[bad]
    if bad == "readonly":
        out.flags.writeable = False
    for mode in ("numpy", "fused"):
        try:
            k = codec_kernels(mode)
        except KernelError:
            continue  # no numba here
        with pytest.raises(KernelError):
            k.f32_to_f16(values, out)


def test_negative_threshold_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        ClientConfig(reuse_wire_buffer_bytes=-1)
