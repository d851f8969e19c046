"""One parser of WANRT_KERNELS for the kernels and the codec: both read a value the same way."""

from __future__ import annotations

import numpy as np
import pytest

from wanrt.codec.kernel_choice import codec_kernels
from wanrt.errors import KernelError
from wanrt.kernel_env import (
    ENV_VAR,
    FUSED_MIN_VALUES,
    PATHS,
    default_path,
    forced_path,
    parse_path,
    requested_path,
)
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


@pytest.mark.parametrize(
    ("env", "on_device", "codec", "forced"),
    [
        ("", False, False, None),
        ("numpy", False, False, "numpy"),
        ("fused", False, True, "fused"),
        ("cupy", True, False, "cupy"),
        ("cupy", False, True, None),  # the codec works on host bytes: cupy means "not forced"
    ],
)
def test_the_one_chooser_reads_a_forced_path_for_every_reader(
    env: str, on_device: bool, codec: bool, forced: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_VAR, env)
    assert forced_path(on_device=on_device, codec=codec) == forced


@pytest.mark.parametrize(("env", "on_device"), [("numpy", True), ("fused", True), ("cupy", False)])
def test_the_one_chooser_refuses_a_forced_path_the_array_cannot_take(
    env: str, on_device: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_VAR, env)
    with pytest.raises(KernelError, match="device" if on_device else "host"):
        forced_path(on_device=on_device)


def test_the_one_chooser_defaults() -> None:
    assert default_path(on_device=True) == "cupy"
    assert default_path() == "fused"
    assert default_path(values=FUSED_MIN_VALUES - 1) == "numpy"
    assert default_path(values=FUSED_MIN_VALUES) == "fused"
    # a mode given by the caller overrides the environment, for the codec as for the kernels
    assert forced_path(codec=True, mode="numpy") == "numpy"
