"""A gateway takes the job's ``lr_scale`` for its trainers in the shared bounds: every site's trainers get
the same value from a decision, and a gateway's own ``POST /config`` refuses a per-site one."""

from __future__ import annotations

import pytest

from gateways.wire.config_update import trainer_config_update
from wanrt.errors import ConfigError
from wanrt.live_settings import MAX_LR_SCALE, split_plan_values
from wanrt.protocol.scheduler.messages import site_values


def test_the_scale_reaches_every_sites_trainers_alike() -> None:
    values = {"lr_scale": 2.5, "local_steps@a": 4, "local_steps@b": 1, "topology": "star"}
    for site, k in (("a", 4), ("b", 1)):
        trainer, plan = split_plan_values(site_values(values, site))
        assert plan == {"topology": "star"}
        msg = trainer_config_update(trainer, 9)
        assert msg.values == {"lr_scale": 2.5, "local_steps": k}


@pytest.mark.parametrize(
    ("key", "bad"), [("lr_scale", 0), ("lr_scale", MAX_LR_SCALE * 2), ("lr_scale@a", 2.0)]
)
def test_a_bad_or_per_site_scale_is_refused_by_name(key: str, bad: object) -> None:
    with pytest.raises(ConfigError) as err:
        trainer_config_update({key: bad}, 1)
    assert err.value.fields["key"] == key
