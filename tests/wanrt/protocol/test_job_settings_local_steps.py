"""A gateway takes ``local_steps`` (ElasticBSP's local micro-steps per WAN iteration) for its trainers in
the shared bounds, from its own site's value of a scheduler decision."""

from __future__ import annotations

import pytest

from wanrt.errors import ConfigError
from wanrt.protocol import ConfigUpdate
from wanrt.protocol.job_settings import MAX_LOCAL_STEPS, JobSettings, PlanSettings, TrainerSettings


def test_local_steps_reach_the_trainers_in_bounds() -> None:
    values = JobSettings(
        site_local_steps={"a": 4, "b": 1}, site_batch_weight={"a": 1.6}, plan=PlanSettings(topology="star")
    )
    assert values.plan == PlanSettings(topology="star")
    msg = ConfigUpdate(values.for_site("a").to_wire(), 9)
    assert msg.values == {"local_steps": 4, "batch_weight": 1.6} and msg.effective_iteration == 9


@pytest.mark.parametrize("bad", [0, MAX_LOCAL_STEPS + 1, 2.5, False])
def test_a_bad_local_steps_is_refused_by_name(bad: object) -> None:
    with pytest.raises(ConfigError) as err:
        TrainerSettings.from_wire({"local_steps": bad})
    assert err.value.fields["key"] == "local_steps"
    with pytest.raises(ConfigError) as err:
        TrainerSettings(local_steps=bad)  # type: ignore[arg-type]
    assert err.value.fields["key"] == "local_steps"
