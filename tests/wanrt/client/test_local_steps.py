"""Local steps (ElasticBSP §4, ``ClientConfig.local_steps``) on one rank with a scripted link: k micro-steps
accumulate, the k-th pushes the site's mean once, ``zero_grad()`` keeps the partial sum, a change of k
applies at a WAN iteration's start, and bad values are refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.wanrt.client.fake_link import ScriptedLink
from tests.wanrt.client.test_context_local import TwoLayers, coeffs
from tests.wanrt.client.test_context_local import make as make_context
from wanrt.client import ClientConfig, SparseOptimizer
from wanrt.client.link.gateway_link import _config_change
from wanrt.client.site.decision import ConfigChange, SiteDecision, decode_body, decode_header, encode
from wanrt.errors import ConfigError, RemoteProtocolError
from wanrt.live_settings import MAX_LOCAL_STEPS, check_live_settings
from wanrt.protocol import ConfigUpdate

pytestmark = pytest.mark.usefixtures("single_rank_group")


def make(secret_file: Path, config: ClientConfig) -> tuple[TwoLayers, SparseOptimizer, ScriptedLink]:
    return make_context(secret_file, {}, config)


def cfg(k: int) -> ClientConfig:
    return ClientConfig.dense_baseline(staleness=0, update_deadline_s=5.0, local_steps=k)


def reference(micro: list[int], layer: int) -> np.ndarray:
    """The site's push for a WAN iteration of these micro-steps, added in autograd's order
    (((g0 + g1) + g2)…) and scaled by the same float32 1/k as the leader."""
    acc = coeffs(micro[0])[layer].clone()
    for t in micro[1:]:
        acc += coeffs(t)[layer]
    return acc.numpy() * np.float32(1.0 / len(micro))


def test_one_local_step_pushes_every_step_exactly_the_gradient(secret_file: Path) -> None:
    model, opt, link = make(secret_file, cfg(1))
    assert opt.ctx.local_steps == 1
    for t in range(3):
        model.loss(*coeffs(t)).backward()
        opt.step()
        opt.zero_grad()
        assert opt.ctx.iteration == t + 1 and not opt.ctx.accumulating
    pushed = {(it, layer): p for it, layer, p in link.pushed}
    assert sorted(pushed) == [(t, layer) for t in range(3) for layer in (0, 1)]
    for t in range(3):
        np.testing.assert_array_equal(pushed[(t, 0)].to_dense(), coeffs(t)[0].numpy())
        np.testing.assert_array_equal(pushed[(t, 1)].to_dense(), coeffs(t)[1].numpy())
    opt.ctx.close()


def test_three_local_steps_push_once_the_mean_of_the_accumulated_sum(secret_file: Path) -> None:
    model, opt, link = make(secret_file, cfg(3))
    for t in range(6):
        before = model.a.detach().clone()
        model.loss(*coeffs(t)).backward()
        opt.step()
        opt.zero_grad()
        assert opt.ctx.iteration == (t + 1) // 3 and opt.ctx.micro_step == (t + 1) % 3
        if (t + 1) % 3:
            torch.testing.assert_close(model.a.detach(), before, rtol=0, atol=0)  # no update mid-superstep
    assert [(it, layer) for it, layer, _ in link.pushed] == [(0, 1), (0, 0), (1, 1), (1, 0)]
    pushed = {(it, layer): p for it, layer, p in link.pushed}
    for it, micro in ((0, [0, 1, 2]), (1, [3, 4, 5])):
        for layer in (0, 1):
            # bit-identical: the same additions in the same order, the same fp32 product
            np.testing.assert_array_equal(pushed[(it, layer)].to_dense(), reference(micro, layer))
    # one site echoed back, sgd with lr 1: the parameters are minus the two pushes
    want_a = -(reference([0, 1, 2], 0) + reference([3, 4, 5], 0))
    np.testing.assert_allclose(model.a.detach().numpy(), want_a, rtol=1e-6, atol=1e-7)
    opt.ctx.close()


def test_zero_grad_keeps_the_partial_sum_until_the_last_micro_step(secret_file: Path) -> None:
    model, opt, _ = make(secret_file, cfg(2))
    c0, _ = coeffs(0)
    model.loss(*coeffs(0)).backward()
    opt.step()
    opt.zero_grad()
    assert opt.ctx.accumulating
    assert model.a.grad is not None
    torch.testing.assert_close(model.a.grad, c0, rtol=0, atol=0)
    opt.zero_grad(set_to_none=False)  # either flavour keeps it
    torch.testing.assert_close(model.a.grad, c0, rtol=0, atol=0)
    model.loss(*coeffs(1)).backward()
    opt.step()
    assert not opt.ctx.accumulating
    opt.zero_grad()
    assert model.a.grad is None
    opt.ctx.close()


def test_a_change_of_local_steps_applies_at_its_wan_iteration(secret_file: Path) -> None:
    model, opt, link = make(secret_file, cfg(3))
    link.announce(ConfigChange(effective_iteration=1, local_steps=2))
    link.announce(ConfigChange(effective_iteration=3, local_steps=1))
    seen: list[tuple[int, int]] = []
    for t in range(8):  # 3 micro-steps, then 2 + 2, then 1 (from iteration 3 on)
        seen.append((opt.ctx.iteration, opt.ctx.local_steps))
        model.loss(*coeffs(t)).backward()
        opt.step()
        opt.zero_grad()
    assert seen == [(0, 3)] * 3 + [(1, 2)] * 2 + [(2, 2)] * 2 + [(3, 1)]
    pushed = {(it, layer): p for it, layer, p in link.pushed}
    for it, micro in ((0, [0, 1, 2]), (1, [3, 4]), (2, [5, 6]), (3, [7])):
        np.testing.assert_array_equal(pushed[(it, 1)].to_dense(), reference(micro, 1))
    opt.ctx.close()


def test_an_announcement_during_held_micro_steps_waits_for_the_iteration_end(secret_file: Path) -> None:
    model, opt, link = make(secret_file, cfg(3))
    model.loss(*coeffs(0)).backward()
    opt.step()
    link.announce(ConfigChange(effective_iteration=0, local_steps=1))  # late: iteration 0 is under way
    for t in (1, 2):
        assert opt.ctx.local_steps == 3
        model.loss(*coeffs(t)).backward()
        opt.step()
        opt.zero_grad()
    # it reached the leader with iteration 0's exchange: iteration 1 has one micro-step
    assert opt.ctx.iteration == 1 and opt.ctx.local_steps == 1
    np.testing.assert_array_equal(
        {(it, layer): p for it, layer, p in link.pushed}[(0, 0)].to_dense(), reference([0, 1, 2], 0)
    )
    opt.ctx.close()


def test_batch_weight_and_local_steps_scale_together(secret_file: Path) -> None:
    model, opt, link = make(secret_file, cfg(2))
    link.announce(ConfigChange(effective_iteration=1, batch_weight=1.5))
    for t in range(4):
        model.loss(*coeffs(t)).backward()
        opt.step()
        opt.zero_grad()
    pushed = {(it, layer): p for it, layer, p in link.pushed}
    acc = coeffs(2)[0] + coeffs(3)[0]
    np.testing.assert_array_equal(pushed[(1, 0)].to_dense(), acc.numpy() * np.float32(1.5 / 2))
    opt.ctx.close()


def test_telemetry_counts_micro_steps(secret_file: Path) -> None:
    model, opt, link = make(secret_file, cfg(3))
    opt.ctx.set_batch_size(8)
    for t in range(9):
        model.loss(*coeffs(t)).backward()
        opt.step()
        opt.zero_grad()
    seen = link.telemetry_seen
    assert [it for it, _ in seen] == [1, 2]  # one report per WAN iteration
    for _, m in seen:
        assert m["local_steps"] == 3.0
        assert m["micro_step_s"] == pytest.approx(m["compute_s"] / 3)
        assert m["samples_per_s"] == pytest.approx(8 * 3 / m["iteration_s"])
    opt.ctx.close()


@pytest.mark.parametrize("bad", [0, -1, MAX_LOCAL_STEPS + 1, 2.0, True])
def test_bad_local_steps_are_refused(bad: object) -> None:
    with pytest.raises(ConfigError) as info:
        ClientConfig(local_steps=bad)  # type: ignore[arg-type]
    assert info.value.key == "local_steps"
    with pytest.raises(ConfigError) as info:
        check_live_settings({"local_steps": bad})
    assert info.value.key == "local_steps"
    with pytest.raises(RemoteProtocolError):
        _config_change(ConfigUpdate({"local_steps": bad}, 3))  # type: ignore[dict-item]


def test_the_live_key_reaches_the_change_and_the_site_broadcast() -> None:
    change = _config_change(ConfigUpdate({"local_steps": 4}, 7))
    assert change == ConfigChange(7, local_steps=4)
    header, body, values = encode(SiteDecision(config_changes=[change, ConfigChange(9, density=0.5)]))
    decode_header(header, max_elements=1 << 20)
    got = decode_body(header, body, values).config_changes
    assert got == [change, ConfigChange(9, density=0.5)]
    assert got[1].local_steps is None


def test_the_gateway_hands_each_site_its_own_local_steps() -> None:
    from wanrt.protocol.scheduler.messages import site_values

    values = {"local_steps@a": 3, "local_steps@b": 1, "density": 0.1}
    assert site_values(values, "a") == {"density": 0.1, "local_steps": 3}
    assert site_values(values, "b") == {"density": 0.1, "local_steps": 1}
