"""The per-iteration measurements a leader reports (compute / idle split, StellaTrain §4.1)."""

from __future__ import annotations

import pytest

from wanrt.client.leader.step_timing import StepTimer


def test_split_of_one_iteration() -> None:
    t = StepTimer()
    assert t.metrics(0.0, batch_size=None, world_size=2) is None  # nothing measured yet; begins at 0
    t.grad_ready(0.3)
    t.grad_ready(0.35)  # only the first gradient of the iteration counts
    t.step(0.7)
    t.waited(0.2)
    t.applied(0.05)
    m = t.metrics(1.0, batch_size=16, world_size=2)
    assert m is not None
    assert m["iteration_s"] == pytest.approx(1.0)
    assert m["forward_s"] == pytest.approx(0.3) and m["backward_s"] == pytest.approx(0.4)
    assert m["idle_s"] == pytest.approx(0.2) and m["idle_frac"] == pytest.approx(0.2)
    assert m["compute_s"] == pytest.approx(0.8) and m["optimizer_s"] == pytest.approx(0.05)
    assert m["samples_per_s"] == pytest.approx(32.0)
    nxt = t.metrics(1.5, batch_size=None, world_size=2)
    assert nxt is not None and nxt["idle_s"] == 0.0 and "batch_size" not in nxt
