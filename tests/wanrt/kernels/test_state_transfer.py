"""A sparse optimizer's state as flat fp32 arrays (parameter resync): what one site exports, another
imports, and both then apply the same updates identically."""

from __future__ import annotations

import numpy as np
import pytest

from wanrt.errors import KernelError
from wanrt.kernels import make_sparse_optimizer
from wanrt.kernels.state_transfer import MAX_EXACT_STEPS, export_state, import_state, state_lengths
from wanrt.payload import SparsePayload

LENS = (64, 40, 0)
BS = 16


def _update(rng: np.random.Generator, layer: int, n: int) -> SparsePayload:
    blocks = np.sort(rng.choice(-(-n // BS), size=max(1, -(-n // BS) // 2), replace=False))
    return SparsePayload.from_dense_blocks(layer, rng.standard_normal(n).astype(np.float32), blocks, BS)


@pytest.mark.parametrize("kind", ["momentum", "adam", "adamw"])
def test_an_imported_state_makes_the_next_steps_identical(kind: str) -> None:
    rng = np.random.default_rng(1)
    a, b = make_sparse_optimizer(kind, lr=0.05), make_sparse_optimizer(kind, lr=0.05)
    pa = [np.ones(n, np.float32) for n in LENS]
    for _ in range(6):
        for layer, n in enumerate(LENS[:2]):
            a.step(layer, pa[layer], _update(rng, layer, n))
    arrays = export_state(a, LENS, BS)
    assert tuple(x.size for x in arrays) == state_lengths(a, LENS, BS)
    assert all(x.dtype == np.float32 for x in arrays)
    import_state(b, LENS, BS, arrays)
    pb = [x.copy() for x in pa]
    for _ in range(4):
        for layer, n in enumerate(LENS[:2]):
            u = _update(rng, layer, n)
            a.step(layer, pa[layer], u)
            b.step(layer, pb[layer], u)
    for x, y in zip(pa, pb, strict=True):
        np.testing.assert_array_equal(x, y)


def test_a_fresh_optimizer_without_state_is_a_fresh_optimizer() -> None:
    rng = np.random.default_rng(2)
    a, fresh = make_sparse_optimizer("adam", lr=0.05), make_sparse_optimizer("adam", lr=0.05)
    import_state(a, LENS, BS, export_state(make_sparse_optimizer("adam"), LENS, BS))  # all zeros
    pa, pf = np.ones(64, np.float32), np.ones(64, np.float32)
    for _ in range(3):
        u = _update(rng, 0, 64)
        a.step(0, pa, u)
        fresh.step(0, pf, u)
    np.testing.assert_array_equal(pa, pf)


def test_a_stateless_optimizer_has_nothing_to_send() -> None:
    assert state_lengths(make_sparse_optimizer("sgd"), LENS, BS) == ()
    assert export_state(make_sparse_optimizer("sgd"), LENS, BS) == []


def test_bad_state_is_refused_and_nothing_changes() -> None:
    rng = np.random.default_rng(3)
    a = make_sparse_optimizer("adam", lr=0.05)
    p = np.ones(64, np.float32)
    a.step(0, p, _update(rng, 0, 64))
    before = [x.copy() for x in export_state(a, LENS, BS)]
    good = export_state(a, LENS, BS)
    for bad, match in (
        (good[:-1], "do not fit"),
        ([*good[:2], good[2] + np.float32(0.5), *good[3:]], "whole numbers"),
        ([*good[:2], good[2] - np.float32(good[2].max() + 1), *good[3:]], "whole numbers"),
        ([*good[:2], np.full_like(good[2], MAX_EXACT_STEPS * 2), *good[3:]], "whole numbers"),
        ([np.full_like(good[0], np.nan), *good[1:]], "NaN"),
    ):
        with pytest.raises(KernelError, match=match):
            import_state(a, LENS, BS, bad)
        for x, y in zip(export_state(a, LENS, BS), before, strict=True):
            np.testing.assert_array_equal(x, y)


def test_state_built_for_another_block_size_is_named() -> None:
    a = make_sparse_optimizer("momentum", lr=0.05)
    p = np.ones(64, np.float32)
    a.step(0, p, SparsePayload.from_dense_blocks(0, np.ones(64, np.float32), np.arange(2), 32))
    with pytest.raises(KernelError, match="block size 32 here, 16 asked"):
        export_state(a, LENS, BS)
