"""A gateway takes ``local_steps`` (ElasticBSP's local micro-steps per WAN iteration) for its trainers in
the shared bounds, from its own ``local_steps@<site>`` of a scheduler decision."""

from __future__ import annotations

import pytest

from gateways.wire.config_update import trainer_config_update
from wanrt.errors import ConfigError
from wanrt.live_settings import MAX_LOCAL_STEPS, split_plan_values
from wanrt.protocol.scheduler.messages import site_values


def test_local_steps_reach_the_trainers_in_bounds() -> None:
    values = {"local_steps@a": 4, "local_steps@b": 1, "batch_weight@a": 1.6, "topology": "star"}
    trainer, plan = split_plan_values(site_values(values, "a"))
    assert plan == {"topology": "star"}
    msg = trainer_config_update(trainer, 9)
    assert msg.values == {"local_steps": 4, "batch_weight": 1.6} and msg.effective_iteration == 9


@pytest.mark.parametrize("bad", [0, MAX_LOCAL_STEPS + 1, 2.5, False])
def test_a_bad_local_steps_is_refused_by_name(bad: object) -> None:
    with pytest.raises(ConfigError) as err:
        trainer_config_update({"local_steps": bad}, 1)
    assert err.value.fields["key"] == "local_steps"
