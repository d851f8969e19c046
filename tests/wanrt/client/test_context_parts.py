"""The client context's parts on their own: live settings switched at their iteration, the checkpoint's
checks (the whole client runs them in test_context_local.py, test_local_steps.py, test_restart_order.py)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytest

from wanrt.client.checkpoint import CHECKPOINT_FORMAT, check_checkpoint
from wanrt.client.config import ClientConfig
from wanrt.client.site.decision import ConfigChange
from wanrt.client.site.settings_in_force import SettingsInForce
from wanrt.errors import ConfigError


@dataclass
class _Knobs:
    density: float = -1.0
    lr_scale: float = 1.0

    def set_density(self, density: float) -> None:
        self.density = density


def test_changes_wait_for_their_iteration_and_apply_in_order(caplog: pytest.LogCaptureFixture) -> None:
    s = SettingsInForce(ClientConfig(density=0.01))
    sizes: list[int] = []
    s.on_batch_size(sizes.append)
    knobs = _Knobs()
    s.schedule([ConfigChange(5, density=0.05, batch_size=8), ConfigChange(3, density=0.02, lr_scale=2.0)])
    assert s.switch(2, knobs, knobs) is None and s.config.density == 0.01  # nothing due yet
    caplog.set_level(logging.WARNING, logger="wanrt.client.site.settings_in_force")
    assert s.switch(5, knobs, knobs) is None  # iteration 3's change arrived late: applied now, first
    assert s.config.density == 0.05 and knobs.density == 0.05 and knobs.lr_scale == 2.0 and sizes == [8]
    assert s.batch_size == 8 and "arrived late" in caplog.text


def test_a_restart_order_is_returned_at_its_iteration_and_a_late_one_is_ignored() -> None:
    s = SettingsInForce(ClientConfig())
    s.schedule([ConfigChange(4, restart=1), ConfigChange(6, restart=0, batch_weight=0.5)])
    order = s.switch(4, None, None)
    assert order is not None and order.restart == 1
    s.schedule([ConfigChange(6, restart=0)])
    assert s.switch(7, None, None) is None  # both iteration-6 orders came late: the rank went on
    assert s.batch_weight == 0.5


def test_a_checkpoint_of_another_iteration_or_format_is_refused_with_how_to_resume() -> None:
    state = {"format": CHECKPOINT_FORMAT, "iteration": 12}
    assert check_checkpoint(state, 12) is state
    with pytest.raises(ConfigError, match="pass resume_at=12"):
        check_checkpoint(state, 0)
    with pytest.raises(ConfigError, match="not a wanrt SparseOptimizer state_dict"):
        check_checkpoint({"format": "torch"}, 12)
