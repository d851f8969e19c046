"""One parser of WANRT_KERNELS for the kernels and the codec: both read a value the same way."""

from __future__ import annotations

import numpy as np
import pytest

from wanrt.codec.kernel_choice import codec_kernels
from wanrt.errors import KernelError
from wanrt.kernel_env import ENV_VAR, PATHS, parse_path, requested_path
from wanrt.kernels import get_kernels


@pytest.mark.parametrize(
    ("raw", "path"), [("", None), ("  ", None), ("NumPy", "numpy"), (" fused\n", "fused")]
)
def test_values_are_case_and_blank_insensitive(raw: str, path: str | None) -> None:
    assert parse_path(raw) == path
    assert requested_path({ENV_VAR: raw}) == path
    assert requested_path({}) is None


@pytest.mark.parametrize("raw", ["numba", "gpu", "cuda", "reference"])
def test_kernels_and_codec_refuse_the_same_values_with_the_same_message(
    raw: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_VAR, raw)
    messages = []
    for use in (lambda: get_kernels(np.zeros(4, np.float32)), lambda: codec_kernels(values=1 << 20)):
        with pytest.raises(KernelError) as info:
            use()
        messages.append(info.value.message)
        assert info.value.fields["key"] == ENV_VAR
    assert messages[0] == messages[1] and ", ".join(PATHS) in messages[0]


def test_cupy_is_a_known_path_for_both(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "cupy")
    assert requested_path() == "cupy"
    assert codec_kernels().name == "numpy"  # the codec works on host bytes: cupy means "not forced"
    with pytest.raises(KernelError, match="host"):  # the kernels were asked for the GPU: refuse
        get_kernels(np.zeros(4, np.float32))
