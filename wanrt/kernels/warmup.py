"""Compile (or load from the on-disk cache) every fused kernel up front.

numba compiles a kernel on its first call: about 1-2 s each, ~10-20 s for all of them on a busy 2-core
machine, ~0.5 s when they come from the cache. A trainer calls :func:`warmup` once at start-up so that the
first training step is not the one that pays, and so that the cost shows up where it can be logged.
"""

from __future__ import annotations

import time

import numpy as np

from wanrt.kernels.compressors import COMPRESSOR_KINDS, make_compressor
from wanrt.kernels.error_feedback import ErrorFeedback
from wanrt.kernels.sparse_optim import OPTIMIZER_KINDS, make_sparse_optimizer

__all__ = ["warmup"]


def warmup() -> float:
    """Run every kernel of the default host path once on tiny inputs; returns the seconds it took."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    for bs in (1, 16, 5):  # element-wise, cache-line and generic block kernels
        g = rng.standard_normal(16 * 40 + 3).astype(np.float32)
        for kind in COMPRESSOR_KINDS:
            if kind == "threshold_v" and bs != 1:
                continue
            c = make_compressor(kind, density=0.05, block_size=bs)
            ef = ErrorFeedback()
            for _ in range(2):
                c.compress(0, g)
                payload = ef.compress(0, g, c)
            for opt_kind in OPTIMIZER_KINDS:
                make_sparse_optimizer(opt_kind).step(0, g.copy(), payload)
    return time.perf_counter() - t0
