"""Shared helpers of the kernel tests: which paths run here, and forcing one for a block of code."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import numpy.typing as npt

from wanrt.errors import KernelError
from wanrt.kernels import ENV_VAR, kernels_by_name
from wanrt.payload import SparsePayload, n_blocks


def _cpu_paths() -> list[str]:
    out = []
    for name in ("numpy", "fused"):
        try:
            kernels_by_name(name)
        except KernelError:
            continue
        out.append(name)
    return out


#: host paths available on this machine (the NumPy reference always is)
CPU_PATHS = _cpu_paths()
#: accelerated host paths, each compared against the reference
FAST_PATHS = [p for p in CPU_PATHS if p != "numpy"]


@contextmanager
def forced_path(name: str | None) -> Iterator[None]:
    """Run the block with ``WANRT_KERNELS=name`` (None: unset), restoring the environment afterwards.

    A context manager rather than monkeypatch so it can be used inside hypothesis tests.
    """
    old = os.environ.get(ENV_VAR)
    if name is None:
        os.environ.pop(ENV_VAR, None)
    else:
        os.environ[ENV_VAR] = name
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(ENV_VAR, None)
        else:
            os.environ[ENV_VAR] = old


def random_update(
    rng: np.random.Generator, n: int, bs: int, frac: float, scale: float = 1.0
) -> SparsePayload:
    """A valid payload touching about ``frac`` of the blocks of an ``n``-element tensor (tail zero-padded)."""
    nb = n_blocks(n, bs)
    count = max(1, round(frac * nb)) if nb else 0
    idx = np.sort(rng.choice(nb, size=count, replace=False)).astype(np.int64) if nb else np.zeros(0, np.int64)
    vals = (rng.standard_normal(count * bs) * scale).astype(np.float32)
    if count and n % bs and int(idx[-1]) == nb - 1:
        vals[(count - 1) * bs + n % bs :] = 0
    return SparsePayload(0, n, bs, idx, vals)


def dense_update(g: npt.NDArray[np.float32], bs: int) -> SparsePayload:
    """A payload holding every block of ``g`` (the dense case the torch comparisons use)."""
    return SparsePayload.from_dense_blocks(0, g, np.arange(n_blocks(g.shape[0], bs), dtype=np.int64), bs)
