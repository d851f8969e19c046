"""The CuPy path against the NumPy reference (skipped without cupy and a CUDA device)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from tests.wanrt.kernels.conftest import random_update
from wanrt.errors import KernelError
from wanrt.kernels import (
    COMPRESSOR_KINDS,
    OPTIMIZER_KINDS,
    kernels_by_name,
    make_compressor,
    make_sparse_optimizer,
)


def _cuda_ready() -> str | None:
    if importlib.util.find_spec("cupy") is None:
        return "cupy is not installed"
    try:
        kernels_by_name("cupy")
    except KernelError as exc:
        return f"cupy path unavailable: {exc.message}"
    return None


_WHY = _cuda_ready()
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(_WHY is not None, reason=_WHY or "")]


@pytest.mark.parametrize("kind", COMPRESSOR_KINDS)
def test_compressors_match_the_reference(kind: str) -> None:
    import cupy

    rng = np.random.default_rng(0)
    host = make_compressor(kind, density=0.01)
    dev = make_compressor(kind, density=0.01)
    for _ in range(4):
        g = rng.standard_normal(100_003).astype(np.float32)
        a, b = host.compress(0, g), dev.compress(0, cupy.asarray(g))
        np.testing.assert_array_equal(a.indices, b.indices)
        np.testing.assert_array_equal(a.values, b.values)


@pytest.mark.parametrize("kind", OPTIMIZER_KINDS)
def test_optimizers_match_the_reference(kind: str) -> None:
    import cupy

    rng = np.random.default_rng(1)
    p = rng.standard_normal(5000).astype(np.float32)
    q = cupy.asarray(p)
    a, b = make_sparse_optimizer(kind, lr=0.01), make_sparse_optimizer(kind, lr=0.01)
    for _ in range(5):
        upd = random_update(rng, 5000, 16, 0.2)
        a.step(0, p, upd)
        b.step(0, q, upd)
    np.testing.assert_allclose(cupy.asnumpy(q), p, rtol=1e-5, atol=1e-6)
