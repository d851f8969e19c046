"""A gateway takes the job's ``lr_scale`` for its trainers in the shared bounds: every site's trainers get
the same value from a decision, and a per-site one is refused by name."""

from __future__ import annotations

import pytest

from wanrt.errors import ConfigError
from wanrt.protocol import ConfigUpdate
from wanrt.protocol.job_settings import MAX_LR_SCALE, JobSettings, PlanSettings, TrainerSettings


def test_the_scale_reaches_every_sites_trainers_alike() -> None:
    values = JobSettings(lr_scale=2.5, site_local_steps={"a": 4, "b": 1}, plan=PlanSettings(topology="star"))
    for site, k in (("a", 4), ("b", 1)):
        assert values.plan == PlanSettings(topology="star")
        msg = ConfigUpdate(values.for_site(site).to_wire(), 9)
        assert msg.values == {"lr_scale": 2.5, "local_steps": k}


@pytest.mark.parametrize(
    ("key", "bad"), [("lr_scale", 0), ("lr_scale", MAX_LR_SCALE * 2), ("lr_scale@a", 2.0)]
)
def test_a_bad_or_per_site_scale_is_refused_by_name(key: str, bad: object) -> None:
    for read in (TrainerSettings.from_wire, JobSettings.from_wire):
        with pytest.raises(ConfigError) as err:
            read({key: bad})
        assert err.value.fields["key"] == key
