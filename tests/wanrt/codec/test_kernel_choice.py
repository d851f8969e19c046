"""The codec's kernel choice: NumPy below the size threshold, fused above it once loaded in the background,
the same bytes either way (that a gateway seeing only small payloads never imports numba:
tests/gateways/service/test_codec_warmup.py)."""

from __future__ import annotations

import os
import threading
from unittest import mock

import numpy as np
import pytest

from wanrt.codec import decode_payload, encode_payload
from wanrt.codec import kernel_choice as kc
from wanrt.codec.index_encodings import INDEX_ENCODINGS, encoded_sizes_of
from wanrt.errors import KernelError
from wanrt.payload import SparsePayload, n_blocks

LIMIT = kc.FUSED_MIN_VALUES


@pytest.fixture
def loader(monkeypatch: pytest.MonkeyPatch) -> kc.FusedLoader:
    """A fresh loader (as in a new process) with WANRT_KERNELS unset."""
    fresh = kc.FusedLoader()
    monkeypatch.setattr(kc, "_LOADER", fresh)
    monkeypatch.delenv(kc.KERNEL_ENV, raising=False)
    return fresh


def payload_of(values: int, block_size: int, seed: int = 0) -> SparsePayload:
    """``values`` value slots in blocks at ~5 % density, with overflowing and special values mixed in."""
    rng = np.random.default_rng(seed)
    count = values // block_size
    nb = count * 20 + 3
    idx = np.sort(rng.choice(nb, size=count, replace=False)).astype(np.int64)
    vals = (rng.standard_normal(count * block_size) * 1e-3).astype(np.float32)
    vals[:: max(1, len(vals) // 7)] = np.float32(1e-6)  # fp16 subnormals
    dense_len = nb * block_size
    return SparsePayload(1, dense_len, block_size, idx, vals)


def wire(p: SparsePayload, dtype: str, index: str) -> tuple[dict[str, object], list[bytes]]:
    meta, bufs = encode_payload(p, wire_dtype=dtype, index_encoding=index)  # type: ignore[arg-type]
    return meta, [bytes(b) for b in bufs]


def test_small_payloads_take_the_reference_and_never_start_the_loader(loader: kc.FusedLoader) -> None:
    assert kc.codec_kernels(values=0).name == "numpy"
    assert kc.codec_kernels(values=LIMIT - 1).name == "numpy"
    p = payload_of(LIMIT - 16, 16)
    decode_payload(*wire(p, "fp16", "varint"))
    assert not loader.started


def test_first_large_payload_is_served_by_numpy_while_the_fused_path_loads(loader: kc.FusedLoader) -> None:
    assert kc.codec_kernels(values=LIMIT).name == "numpy"  # never a compile inside the call
    assert loader.started
    assert loader.wait(120) is not None, loader.error
    assert kc.codec_kernels(values=LIMIT).name == "fused"
    assert kc.codec_kernels(values=LIMIT - 1).name == "numpy"


@pytest.mark.parametrize("block_size", [1, 16])
def test_bytes_are_identical_across_the_threshold_switch(loader: kc.FusedLoader, block_size: int) -> None:
    """The same payloads encoded before the fused kernels are ready, and after, give the same bytes; so do
    payloads just below and just above the threshold against the forced reference."""
    large = [payload_of(LIMIT, block_size, s) for s in range(3)] + [payload_of(4 * LIMIT, block_size, 9)]
    small = payload_of(LIMIT - block_size, block_size, 5)
    nb = n_blocks(large[0].dense_len, block_size)
    cases = [
        (p, dtype, index)
        for p in [*large, small]
        for dtype in ("fp32", "fp16", "bf16")
        for index in INDEX_ENCODINGS
        if index in encoded_sizes_of(p.indices, n_blocks(p.dense_len, block_size), kc.codec_kernels("numpy"))
    ]
    assert nb > 0 and len(cases) > 20
    gate = threading.Event()  # hold the background load until every "before" payload is encoded
    load = loader._load

    def gated_load() -> None:
        gate.wait(120)
        load()

    loader._load = gated_load  # type: ignore[method-assign]
    before = [wire(*c) for c in cases]
    assert loader.started and loader.ready() is None
    gate.set()
    assert loader.wait(120) is not None, loader.error
    assert kc.codec_kernels(values=large[0].nnz).name == "fused"
    after = [wire(*c) for c in cases]
    with mock.patch.dict(os.environ, {kc.KERNEL_ENV: "numpy"}):
        forced = [wire(*c) for c in cases]
    assert after == before == forced
    for (p, _, _), (meta, bufs) in zip(cases, after, strict=True):
        q = decode_payload(meta, bufs)
        np.testing.assert_array_equal(q.indices, p.indices)
        with mock.patch.dict(os.environ, {kc.KERNEL_ENV: "numpy"}):
            r = decode_payload(meta, bufs)
        np.testing.assert_array_equal(q.indices, r.indices)
        np.testing.assert_array_equal(q.values.view(np.uint8), r.values.view(np.uint8))


def test_a_failed_load_keeps_the_reference(loader: kc.FusedLoader) -> None:
    with mock.patch("wanrt.codec.fused_kernels.load", side_effect=ImportError("no numba here")):
        assert loader.wait(60) is None
    assert loader.error is not None and "no numba here" in loader.error
    assert kc.codec_kernels(values=10 * LIMIT).name == "numpy"


def test_forced_paths_ignore_the_threshold(loader: kc.FusedLoader) -> None:
    assert kc.codec_kernels("numpy", values=10 * LIMIT).name == "numpy"
    assert kc.codec_kernels("fused", values=1).name == "fused"
    assert kc.codec_kernels(" CUPY ", values=1).name == "numpy"  # cupy = unset for host bytes
    assert not loader.started
    with pytest.raises(KernelError, match="numpy, fused, cupy"):
        kc.codec_kernels("gpu")
