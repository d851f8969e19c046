"""The apply's per-layer pinned buffers for CUDA parameters: grown by doubling, counted against
``ClientConfig.pinned_update_bytes``, and given up for good by a layer that would pass it. Run on the CPU
with a stand-in for CuPy's pinned allocator (the real one is exercised by the ``cuda``-marked tests)."""

from __future__ import annotations

import numpy as np
import pytest

import wanrt.client.site.update_apply as update_apply
from wanrt.client.config import ClientConfig
from wanrt.client.site.update_apply import UpdateApplier
from wanrt.errors import ConfigError
from wanrt.kernels.cupy_staging import PinnedUpdate
from wanrt.payload import SparsePayload


class _Memory(bytearray):
    """Host memory with the ``ptr`` of CuPy's PinnedMemoryPointer."""

    @property
    def ptr(self) -> int:
        return int(np.frombuffer(self, np.uint8).ctypes.data)


class _Staging:
    def __init__(self) -> None:
        self.allocated: list[int] = []

    def alloc_pinned(self, nbytes: int) -> _Memory:
        self.allocated.append(nbytes)
        return _Memory(nbytes)

    def remember(self, buf: PinnedUpdate) -> None:
        pass

    def forget(self, buf: PinnedUpdate) -> None:
        pass


class _Kernels:
    def __init__(self) -> None:
        self.staging = _Staging()

    def pinned_update(self) -> PinnedUpdate:
        return PinnedUpdate(self.staging)  # type: ignore[arg-type]


def _payload(blocks: int, bs: int = 16) -> SparsePayload:
    idx = np.arange(blocks, dtype=np.int64)
    return SparsePayload(0, 1 << 20, bs, idx, np.ones(blocks * bs, np.float32))


@pytest.fixture
def kernels(monkeypatch: pytest.MonkeyPatch) -> _Kernels:
    k = _Kernels()
    monkeypatch.setattr(update_apply, "kernels_by_name", lambda name: k)
    return k


def test_buffers_grow_by_doubling_and_count_against_the_budget(kernels: _Kernels) -> None:
    app = UpdateApplier(pinned_bytes=1 << 20)
    small, big = _payload(100), _payload(5000)  # ~7.2 KB and ~360 KB
    a = app._pinned_buffer(0, small)
    assert a is not None
    a.arrays(small.nnz_blocks, small.nnz)
    assert a.nbytes == 1 << 16  # the smallest allocation
    assert app._pinned_buffer(0, small) is a  # no growth: nothing more counted
    assert app._pinned_used == 1 << 16
    b = app._pinned_buffer(1, big)
    assert b is not None
    idx, vals = b.arrays(big.nnz_blocks, big.nnz)
    assert idx.shape == (5000,) and vals.shape == (80_000,)
    assert app._pinned_used == (1 << 16) + b.nbytes
    # a third layer that would pass the 1 MiB budget takes the ordinary way, for good
    assert app._pinned_buffer(2, _payload(12_000)) is None
    assert app._pinned_buffer(2, small) is None
    # a layer whose update outgrows what is left lets its buffer go
    assert app._pinned_buffer(1, _payload(14_000)) is None
    assert app._pinned_used == 1 << 16


def test_zero_budget_never_pins(kernels: _Kernels) -> None:
    app = UpdateApplier(pinned_bytes=0)
    assert app._pinned_buffer(0, _payload(1)) is None
    assert kernels.staging.allocated == []


def test_the_budget_is_a_checked_config_key() -> None:
    assert ClientConfig().pinned_update_bytes == 1 << 30
    with pytest.raises(ConfigError, match="pinned_update_bytes"):
        ClientConfig(pinned_update_bytes=-1)


def test_arrays_wait_for_the_last_copy_and_hand_out_views_of_one_buffer(kernels: _Kernels) -> None:
    buf = kernels.pinned_update()

    class _Done:
        waited = 0

        def synchronize(self) -> None:
            _Done.waited += 1

    idx, vals = buf.arrays(3, 48)
    buf.copied = _Done()
    idx2, vals2 = buf.arrays(3, 48)
    assert _Done.waited == 1 and buf.copied is None
    assert buf.views == (idx2, vals2)
    assert np.shares_memory(idx, idx2) and vals2.ctypes.data == buf.ptr + 256
    assert vals.shape == (48,) and vals2.shape == (48,)
