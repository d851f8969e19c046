"""What ``frozen_world`` changes for a run, and that it puts everything back."""

from __future__ import annotations

import gc
import os

import pytest

from sims.des.world import RUN_GC_THRESHOLDS, frozen_world
from wanrt.codec.kernel_choice import KERNEL_ENV, codec_kernels


def test_pins_the_codec_to_numpy_when_nothing_is_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KERNEL_ENV, raising=False)
    with frozen_world():
        assert os.environ[KERNEL_ENV] == "numpy"
        assert codec_kernels(values=1 << 20).name == "numpy"  # no background compile for a big payload
    assert KERNEL_ENV not in os.environ


def test_keeps_a_forced_path_and_restores_a_blank_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KERNEL_ENV, "fused")
    with frozen_world():
        assert os.environ[KERNEL_ENV] == "fused"
    assert os.environ[KERNEL_ENV] == "fused"
    monkeypatch.setenv(KERNEL_ENV, " ")
    with frozen_world():
        assert os.environ[KERNEL_ENV] == "numpy"
    assert os.environ[KERNEL_ENV] == " "


def test_collector_is_off_during_the_run_and_restored() -> None:
    before = gc.get_threshold()
    was = gc.isenabled()
    gc.enable()
    try:
        with frozen_world():
            assert not gc.isenabled()
            assert gc.get_threshold() == RUN_GC_THRESHOLDS
        assert gc.isenabled()
        assert gc.get_threshold() == before
    finally:
        if not was:
            gc.disable()
