"""The CUDA source of the CuPy path compiles (with ``nvcc``, which a GPU-less build machine may have).

The kernels can only run on a GPU (tests/wanrt/kernels/test_cupy_path.py, ``cuda``-marked), but a typo in
their source would otherwise first show on the GPU machine, whose time is scarce. Every combination of
defines the launcher uses is compiled: the selection with and without the residual add, block sizes 1, a
non-power of two, 16 and the largest fused one; the optimizers at a block inside and beyond one CUDA block.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from wanrt.kernels.cupy_kernels import MAX_FUSED_BLOCK
from wanrt.kernels.cupy_source import BLOCKS_SOURCE, OPTIM_SOURCE, SELECT_SOURCE, compile_options
from wanrt.kernels.reference import next_pow2

NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")


def _compile(tmp_path: Path, source: str, opts: tuple[str, ...]) -> None:
    src = tmp_path / "k.cu"
    src.write_text(source)
    assert NVCC is not None
    flags = [o for o in opts if o != "--std=c++14"]
    cmd = [NVCC, "-c", "-std=c++14", "-arch=sm_80", *flags, str(src), "-o", str(tmp_path / "k.o")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("bs", [1, 5, 16, MAX_FUSED_BLOCK])
def test_selection_source_compiles(tmp_path: Path, bs: int) -> None:
    for add in (0, 1):
        for vec in (0, 1) if bs % 4 == 0 else (0,):
            opts = compile_options(BS=bs, P=next_pow2(bs), ITEMS=4, HAS_ADD=add, VEC=vec)
            _compile(tmp_path, SELECT_SOURCE, opts)


@pytest.mark.parametrize("bs", [1, 16, 512])
def test_optimizer_source_compiles(tmp_path: Path, bs: int) -> None:
    _compile(tmp_path, OPTIM_SOURCE, compile_options(BS=bs))


@pytest.mark.parametrize("bs", [1, 16, 5])
def test_block_source_compiles(tmp_path: Path, bs: int) -> None:
    _compile(tmp_path, BLOCKS_SOURCE, compile_options(BS=bs))
