"""Compression and sparse-optimizer kernels (StellaTrain §3.1–3.2).

Public API (see docs/kernels.md)::

    c = make_compressor("threshold_v_block", density=0.01)      # cache-aware threshold-v, 16-float blocks
    ef = ErrorFeedback()
    payload = ef.compress(layer, grad, c)                         # grad + residual -> SparsePayload
    opt = make_sparse_optimizer("adam", lr=1e-3)
    opt.step(key, param, payload)                                 # in place, O(nnz)

Each kernel has a NumPy reference, a fused CPU path (numba) and a CuPy path; ``WANRT_KERNELS=numpy|fused|
cupy`` forces one. Importing this package compiles nothing and imports neither numba nor cupy.
"""

from wanrt.kernels.backend import ENV_VAR, PATHS, available_paths, get_kernels, kernels_by_name
from wanrt.kernels.compressors import (
    COMPRESSOR_KINDS,
    Compressor,
    CompressorKind,
    RandomK,
    ThresholdV,
    TopK,
    make_compressor,
)
from wanrt.kernels.config import AdamConfig, CompressorConfig, MomentumConfig, SGDConfig
from wanrt.kernels.error_feedback import ErrorFeedback
from wanrt.kernels.sparse_optim import (
    OPTIMIZER_KINDS,
    OptimizerKind,
    SparseAdam,
    SparseMomentum,
    SparseOptimizer,
    SparseSGD,
    make_sparse_optimizer,
)
from wanrt.kernels.warmup import warmup

__all__ = [
    "COMPRESSOR_KINDS",
    "ENV_VAR",
    "OPTIMIZER_KINDS",
    "PATHS",
    "AdamConfig",
    "Compressor",
    "CompressorConfig",
    "CompressorKind",
    "ErrorFeedback",
    "MomentumConfig",
    "OptimizerKind",
    "RandomK",
    "SGDConfig",
    "SparseAdam",
    "SparseMomentum",
    "SparseOptimizer",
    "SparseSGD",
    "ThresholdV",
    "TopK",
    "available_paths",
    "get_kernels",
    "kernels_by_name",
    "make_compressor",
    "make_sparse_optimizer",
    "warmup",
]
