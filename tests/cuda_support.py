"""Whether this machine runs the ``cuda``-marked tests, and the skip mark that says why not.

One place for the question, so every CUDA test skips with the same reason (a test run on a CPU machine
lists it: "cupy is not installed", "no CUDA device", ...), and ``tools/gpu_check.sh`` can ask it too.
"""

from __future__ import annotations

import importlib.util

import pytest

from wanrt.errors import KernelError

__all__ = ["CUDA_SKIP", "TORCH_CUDA_SKIP", "cuda_unavailable", "torch_cuda_unavailable"]


def torch_cuda_unavailable() -> str | None:
    """Why torch cannot use a CUDA device here, or None when it can."""
    import torch

    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device"
    return None


def cuda_unavailable() -> str | None:
    """Why the CuPy kernel path cannot run here (cupy and a CUDA device), or None when it can."""
    if importlib.util.find_spec("cupy") is None:
        return "cupy is not installed (pip install wanrt[gpu] / wanrt[gpu-cuda13])"
    from wanrt.kernels import kernels_by_name

    try:
        kernels_by_name("cupy")
    except KernelError as exc:
        return f"cupy path unavailable: {exc.message}"
    return torch_cuda_unavailable()


_WHY = cuda_unavailable()
_WHY_TORCH = torch_cuda_unavailable()
#: skip mark for tests that need the CuPy path and a CUDA torch
CUDA_SKIP = pytest.mark.skipif(_WHY is not None, reason=_WHY or "")
#: skip mark for tests that need only torch with CUDA
TORCH_CUDA_SKIP = pytest.mark.skipif(_WHY_TORCH is not None, reason=_WHY_TORCH or "")
