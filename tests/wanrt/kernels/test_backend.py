"""Path selection: WANRT_KERNELS parsing, forced paths, clear errors for unavailable ones."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import pytest

from tests.wanrt.kernels.conftest import CPU_PATHS, forced_path
from wanrt.errors import KernelError
from wanrt.kernels import available_paths, get_kernels, kernels_by_name, make_compressor

HAVE_CUPY = importlib.util.find_spec("cupy") is not None


def test_reference_is_always_available() -> None:
    assert "numpy" in available_paths()
    assert kernels_by_name("numpy").name == "numpy"


def test_default_on_host_is_fused_when_numba_works() -> None:
    with forced_path(None):
        k = get_kernels(np.zeros(4, np.float32))
    assert k.name == ("fused" if "fused" in CPU_PATHS else "numpy")


@pytest.mark.parametrize("name", CPU_PATHS)
def test_forcing_a_host_path(name: str) -> None:
    with forced_path(name):
        assert get_kernels(np.zeros(4, np.float32)).name == name


@pytest.mark.parametrize("value", ["NUMPY", " fused "])
def test_value_is_case_and_space_insensitive(value: str) -> None:
    with forced_path(value):
        assert get_kernels(np.zeros(4, np.float32)).name == value.strip().lower()


@pytest.mark.parametrize("value", ["numba", "gpu", "c"])
def test_invalid_value_is_a_kernel_error_naming_the_choices(value: str) -> None:
    with forced_path(value), pytest.raises(KernelError, match="numpy, fused, cupy"):
        make_compressor("threshold_v_block", density=0.1).compress(0, np.ones(64, np.float32))


@pytest.mark.skipif(HAVE_CUPY, reason="cupy is installed here; the unavailable-path error cannot be shown")
def test_forcing_cupy_without_cupy_is_a_clear_error() -> None:
    with pytest.raises(KernelError, match="cupy"):
        kernels_by_name("cupy")


def test_forcing_cupy_on_a_host_array_is_an_error() -> None:
    with forced_path("cupy"), pytest.raises(KernelError, match="host"):
        get_kernels(np.zeros(4, np.float32))


def test_unknown_path_name() -> None:
    with pytest.raises(KernelError, match="unknown kernel path"):
        kernels_by_name("fortran")


def test_import_has_no_side_effects() -> None:
    code = (
        "import sys, wanrt.kernels; "
        "print(all(m not in sys.modules for m in ('numba', 'cupy', 'torch', 'wanrt.kernels.fused_cpu')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


@pytest.mark.skipif("fused" not in CPU_PATHS, reason="numba missing")
def test_jit_falls_back_to_no_cache_when_no_location_is_writable() -> None:
    from wanrt.kernels import fused_intrinsics

    namespace: dict[str, object] = {}
    exec("def twice(x):\n    return 2 * x\n", namespace)  # no source file: numba has nowhere to cache it
    before = list(fused_intrinsics._uncached)
    try:
        fn = fused_intrinsics.jit(namespace["twice"])  # type: ignore[arg-type]
        assert fn(21) == 42
        assert not fused_intrinsics.caching()
    finally:
        fused_intrinsics._uncached[:] = before
