"""The outer loop's mode reaches the trainer like every live setting: a ConfigUpdate's ``outer_steps``,
``fragments`` and ``outer_coding`` travel in the site leader's broadcast to every rank, wait for their
effective iteration, and are then what the Context reports (what the outer loop reads)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.wanrt.client.test_context_local import coeffs
from tests.wanrt.client.test_local_steps import cfg, make
from wanrt.client.config import ClientConfig
from wanrt.client.link.gateway_link import _config_change
from wanrt.client.site.decision import (
    CONFIG_FIELDS,
    ConfigChange,
    SiteDecision,
    decode_body,
    decode_header,
    encode,
)
from wanrt.client.site.settings_in_force import SettingsInForce
from wanrt.errors import MalformedPayload
from wanrt.protocol import ConfigUpdate
from wanrt.protocol.job_settings import OUTER_CODINGS, JobSettings


def _round_trip(d: SiteDecision) -> SiteDecision:
    header, body, values = encode(d)
    decode_header(header, max_elements=1 << 20)
    return decode_body(header, body, values)


@pytest.mark.parametrize("coding", [*OUTER_CODINGS, None])
def test_the_broadcast_carries_the_mode(coding: str | None) -> None:
    own = JobSettings(outer_steps=32, fragments=4, outer_coding=coding, lr_scale=2.0).for_site("a")
    change = ConfigChange.of(17, own)
    assert (change.outer_steps, change.fragments, change.outer_coding) == (32, 4, coding)
    assert _round_trip(SiteDecision(config_changes=[change, ConfigChange(20)])).config_changes == [
        change,
        ConfigChange(20),
    ]


def test_an_unknown_coding_index_is_refused() -> None:
    header, body, values = encode(SiteDecision(config_changes=[ConfigChange(3, outer_coding="int4")]))
    body = body.copy()
    body[CONFIG_FIELDS - 1] = len(OUTER_CODINGS)
    with pytest.raises(MalformedPayload):
        decode_body(header, body, values)


def test_the_mode_switches_at_its_iteration_and_survives_a_checkpoint() -> None:
    s = SettingsInForce(ClientConfig())
    assert (s.outer_steps, s.fragments, s.outer_coding) == (None, None, None)  # no decision yet
    s.schedule([ConfigChange(5, outer_steps=16, fragments=2, outer_coding="int2")])
    for it in range(5):
        s.switch(it, None, None)
        assert (s.outer_steps, s.fragments) == (None, None)
    s.switch(5, None, None)
    assert (s.outer_steps, s.fragments, s.outer_coding) == (16, 2, "int2")
    saved = s.checkpoint()
    back = SettingsInForce(ClientConfig())
    back.restore(saved)
    assert (back.outer_steps, back.fragments, back.outer_coding) == (16, 2, "int2")
    old = {k: v for k, v in saved.items() if not k.startswith(("outer", "fragments"))}
    back.restore(old)  # a checkpoint from before the mode existed: no decision had set it
    assert (back.outer_steps, back.fragments, back.outer_coding) == (None, None, None)
    assert np.isfinite(back.batch_weight)


@pytest.mark.usefixtures("single_rank_group")
def test_the_context_shows_the_mode_from_its_wan_iteration(secret_file: Path) -> None:
    """Through the real Context and link path (a scripted gateway): what ``wanrt.DiLoCo`` reads."""
    model, opt, link = make(secret_file, cfg(1))
    update = ConfigUpdate(
        JobSettings(outer_steps=8, fragments=2, outer_coding="int4").for_site("a").to_wire(), 2
    )
    link.announce(_config_change(update))
    for t in range(4):
        ctx = opt.ctx
        want = (8, 2, "int4") if t >= 2 else (None, None, None)
        assert (ctx.iteration, ctx.outer_steps, ctx.fragments, ctx.outer_coding) == (t, *want)
        model.loss(*coeffs(t)).backward()
        opt.step()
        opt.zero_grad()
    opt.ctx.close()
