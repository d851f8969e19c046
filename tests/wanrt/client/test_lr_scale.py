"""The job's live ``lr_scale`` (STAR §IV-C's ADJUST_LR) on one rank with a scripted link: it applies from
its effective WAN iteration as ``lr × lr_scale``, a user's ``opt.lr`` (or schedule) stays separate from it,
it is reported in telemetry, and bad values are refused on every path."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.wanrt.client.test_context_local import coeffs
from tests.wanrt.client.test_local_steps import cfg, make
from wanrt.client.link.gateway_link import _config_change
from wanrt.client.site.decision import ConfigChange, SiteDecision, decode_body, decode_header, encode
from wanrt.errors import ConfigError, ProtocolError, RemoteProtocolError
from wanrt.kernels import make_sparse_optimizer
from wanrt.payload import SparsePayload
from wanrt.protocol import ConfigUpdate
from wanrt.protocol.job_settings import MAX_LR_SCALE, JobSettings, TrainerSettings

pytestmark = pytest.mark.usefixtures("single_rank_group")


def test_a_scale_applies_from_its_wan_iteration_and_the_users_lr_stays_apart(secret_file: Path) -> None:
    # one site echoed back, sgd: each WAN iteration moves a by -lr × scale × its push
    model, opt, link = make(secret_file, cfg(1))
    link.announce(ConfigChange(effective_iteration=2, lr_scale=4.0))
    link.announce(ConfigChange(effective_iteration=4, lr_scale=1.0))
    lrs = {0: 1.0, 1: 1.0, 2: 1.0, 3: 0.5, 4: 0.5}  # the user's schedule: halves its lr at iteration 3
    want = np.zeros(20, dtype=np.float64)
    for t in range(5):
        opt.lr = lrs[t]
        scale = 4.0 if 2 <= t < 4 else 1.0
        assert (opt.ctx.iteration, opt.ctx.lr_scale, opt.lr_scale) == (t, scale, scale)
        assert opt.lr == lrs[t] and opt.effective_lr == lrs[t] * scale
        model.loss(*coeffs(t)).backward()
        opt.step()
        opt.zero_grad()
        want -= lrs[t] * scale * coeffs(t)[0].numpy().astype(np.float64)
        np.testing.assert_allclose(model.a.detach().numpy(), want, rtol=1e-5, atol=1e-6)
    assert opt.lr == 0.5  # the scale never leaked into the user's lr
    opt.ctx.close()


def test_with_local_steps_the_scale_applies_at_the_wan_iterations_start(secret_file: Path) -> None:
    model, opt, link = make(secret_file, cfg(2))
    link.announce(ConfigChange(effective_iteration=1, local_steps=3, lr_scale=2.5))
    seen = []
    for t in range(5):  # iteration 0: 2 micro-steps; iteration 1: 3, at the new scale
        seen.append((opt.ctx.iteration, opt.ctx.local_steps, opt.ctx.lr_scale))
        model.loss(*coeffs(t)).backward()
        opt.step()
        opt.zero_grad()
    assert seen == [(0, 2, 1.0), (0, 2, 1.0), (1, 3, 2.5), (1, 3, 2.5), (1, 3, 2.5)]
    pushed = {(it, layer): p.to_dense() for it, layer, p in link.pushed}
    want = -(pushed[(0, 0)].astype(np.float64) + 2.5 * pushed[(1, 0)].astype(np.float64))
    np.testing.assert_allclose(model.a.detach().numpy(), want, rtol=1e-5, atol=1e-6)
    opt.ctx.close()


def test_telemetry_reports_the_scale_in_force(secret_file: Path) -> None:
    model, opt, link = make(secret_file, cfg(1))
    opt.ctx.set_batch_size(4)
    link.announce(ConfigChange(effective_iteration=2, lr_scale=3.0))
    for t in range(4):
        model.loss(*coeffs(t)).backward()
        opt.step()
        opt.zero_grad()
    reports = dict(link.telemetry_seen)
    assert reports and all("lr_scale" in m for m in reports.values())
    for it, m in reports.items():
        assert m["lr_scale"] == (3.0 if it >= 2 else 1.0), (it, m)
    opt.ctx.close()


def test_the_kernel_steps_with_lr_times_scale_and_checkpoints_the_users_lr() -> None:
    p = np.zeros(4, dtype=np.float32)
    upd = SparsePayload(0, 4, 2, np.array([0, 1], dtype=np.int64), np.ones(4, dtype=np.float32))
    k = make_sparse_optimizer("sgd", lr=0.1)
    k.lr_scale = 3.0
    k.step(0, p, upd)
    np.testing.assert_allclose(p, -0.3, rtol=1e-6)
    k.lr = 0.2  # a schedule sets the user's lr: the scale stays
    assert (k.lr, k.lr_scale) == (0.2, 3.0) and k.effective_lr == pytest.approx(0.6)
    assert k.state_dict()["lr"] == 0.2 and k.hyper()["lr"] == 0.2
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ConfigError):
            k.lr_scale = bad
    assert k.lr_scale == 3.0


def test_at_scale_one_every_kind_steps_bit_identically() -> None:
    upd = SparsePayload(0, 8, 4, np.array([1], dtype=np.int64), np.arange(4, dtype=np.float32) + 1)
    for kind in ("sgd", "momentum", "adam", "adamw"):
        a, b = np.ones(8, dtype=np.float32), np.ones(8, dtype=np.float32)
        plain, scaled = make_sparse_optimizer(kind, lr=0.01), make_sparse_optimizer(kind, lr=0.01)
        scaled.lr_scale = 2.0
        scaled.lr_scale = 1.0
        for _ in range(3):
            plain.step(0, a, upd)
            scaled.step(0, b, upd)
        np.testing.assert_array_equal(a, b)


def test_the_scale_reaches_the_optimizer_of_a_momentum_kind() -> None:
    # a stateful kind too: the step size is lr × scale, the buffer is the gradient's
    k = make_sparse_optimizer("momentum", lr=0.1, momentum=0.9)
    p = torch.zeros(4)
    upd = SparsePayload(0, 4, 4, np.array([0], dtype=np.int64), np.ones(4, dtype=np.float32))
    k.lr_scale = 2.0
    k.step(0, p, upd)
    torch.testing.assert_close(p, torch.full((4,), -0.2))


@pytest.mark.parametrize("bad", [0, 0.0, -1.0, MAX_LR_SCALE * 1.01, 1000, math.inf, math.nan, True, "2"])
def test_bad_scales_are_refused_on_every_path(bad: object) -> None:
    with pytest.raises(ConfigError) as info:
        TrainerSettings.from_wire({"lr_scale": bad})
    assert info.value.key == "lr_scale"
    # on the link: the message's own check (non-finite numbers) or the trainer's (RemoteProtocolError)
    with pytest.raises(ProtocolError):
        _config_change(ConfigUpdate({"lr_scale": bad}, 3))  # type: ignore[dict-item]
    if isinstance(bad, (int, float)) and math.isfinite(bad):
        with pytest.raises(RemoteProtocolError):
            _config_change(ConfigUpdate({"lr_scale": bad}, 3))


def test_a_per_site_scale_is_refused_as_job_wide() -> None:
    with pytest.raises(ConfigError) as info:
        JobSettings.from_wire({"lr_scale@a": 2.0})
    assert info.value.key == "lr_scale@a"
    assert "whole job" in str(info.value)


def test_the_live_key_reaches_the_change_and_the_site_broadcast() -> None:
    assert TrainerSettings.from_wire({"lr_scale": 2}).to_wire() == {"lr_scale": 2}
    assert TrainerSettings.from_wire({"lr_scale": MAX_LR_SCALE}).lr_scale == MAX_LR_SCALE
    change = _config_change(ConfigUpdate({"lr_scale": 2, "local_steps": 4}, 7))
    assert change == ConfigChange(7, local_steps=4, lr_scale=2.0)
    header, body, values = encode(SiteDecision(config_changes=[change, ConfigChange(9, density=0.5)]))
    decode_header(header, max_elements=1 << 20)
    got = decode_body(header, body, values).config_changes
    assert got == [change, ConfigChange(9, density=0.5)]
    assert got[1].lr_scale is None
