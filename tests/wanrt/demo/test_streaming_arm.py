"""``wanrt demo --mode streaming``: Streaming DiLoCo (arXiv 2501.18512, ``wanrt.DiLoCo(fragments=P)``) as a
demo arm, end to end at the quick size with real gateway daemons and trainer processes: the fragments are
exchanged in turn (P rounds per H inner steps), every site ends with the same parameters, and the loss
falls."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from wanrt.demo.config import QUICK
from wanrt.demo.runner import Demo

pytestmark = pytest.mark.slow


@pytest.mark.timeout(240)
def test_the_streaming_arm_trains_every_site_to_the_same_model(tmp_path: Path) -> None:
    cfg = dataclasses.replace(
        QUICK,
        modes=("streaming",),
        outer_steps=8,
        outer_fragments=4,
        fluctuating=False,
        scheduler=False,
        max_iters=24,
        max_train_s=60.0,
    )
    with Demo(cfg, tmp_path / "out", progress=False, on_line=lambda _line: None) as demo:
        run = demo.run("streaming", links=cfg)
    assert run.distinct_final_models == 1
    assert run.iterations >= 8  # WAN iterations: one fragment round every H/P = 2 inner steps
    assert run.curve[-1].loss < run.curve[0].loss
