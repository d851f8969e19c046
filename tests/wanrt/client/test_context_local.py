"""One site, one rank, a scripted in-process link: the step logic without sockets or other processes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

import wanrt
from tests.wanrt.client.fake_link import ScriptedLink, Timing, scripted
from wanrt.client import ClientConfig, SparseOptimizer, StepWithoutBackward
from wanrt.client.site.decision import ConfigChange
from wanrt.errors import WanrtTimeout

pytestmark = pytest.mark.usefixtures("single_rank_group")


class TwoLayers(torch.nn.Module):
    """loss = <a, c_t> + <b, d_t>: the gradient of each layer is exactly the coefficient fed in."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Parameter(torch.zeros(20))
        self.b = torch.nn.Parameter(torch.zeros(36))

    def loss(self, c: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        return (self.a * c).sum() + (self.b * d).sum()


def make(
    secret_file: Path, timing: dict[int, Timing], config: ClientConfig
) -> tuple[TwoLayers, SparseOptimizer, ScriptedLink]:
    links: list[ScriptedLink] = []
    ctx = wanrt.client.init(
        "mem://gw",
        site="a",
        job="j",
        secret_file=secret_file,
        config=config,
        link_factory=scripted(timing, links),
    )
    model = TwoLayers()
    opt = SparseOptimizer(model.named_parameters(), "sgd", lr=1.0, ctx=ctx)
    return model, opt, links[0]


def coeffs(t: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(t)
    return torch.randn(20, generator=g), torch.randn(36, generator=g)


DENSE_STALE = ClientConfig.dense_baseline(staleness=1, update_deadline_s=5.0)


def test_partial_staleness_applies_arrived_layers_fresh_and_late_ones_one_step_later(
    secret_file: Path,
) -> None:
    # layer ids follow named_parameters(): 0 = a, 1 = b. a's update comes back late, b's before the step ends
    config = dataclasses.replace(DENSE_STALE, weight_prediction=False)
    model, opt, link = make(secret_file, {0: "late", 1: "instant"}, config)
    sum_c, sum_d = torch.zeros(20), torch.zeros(36)
    for t in range(4):
        c, d = coeffs(t)
        model.loss(c, d).backward()
        opt.step()
        opt.zero_grad()
        sum_d += d
        # b: every update up to t applied (fresh); a: every update up to t - 1 (stale by exactly one)
        torch.testing.assert_close(model.b.detach(), -sum_d)
        torch.testing.assert_close(model.a.detach(), -sum_c)
        sum_c += c
    opt.ctx.close()  # the final flush applies what is still outstanding
    torch.testing.assert_close(model.a.detach(), -sum_c)
    assert link.closed
    assert [(it, layer) for it, layer, _ in link.pushed][:2] == [(0, 1), (0, 0)]  # last layer first


def test_weight_prediction_moves_a_late_layer_by_the_own_payload_and_back_exactly(secret_file: Path) -> None:
    # one site: its own payload IS the job's update, so between steps the late layer sits exactly where the
    # stale update will put it (the delay is gone), and the job's parameters after close() are bit for bit
    # those of the same run without prediction
    ends = []
    for predicting in (True, False):
        config = dataclasses.replace(DENSE_STALE, weight_prediction=predicting)
        model, opt, _ = make(secret_file, {0: "late", 1: "instant"}, config)
        sum_c, sum_d = torch.zeros(20), torch.zeros(36)
        for t in range(4):
            c, d = coeffs(t)
            model.loss(c, d).backward()
            opt.step()
            opt.zero_grad()
            sum_c += c
            sum_d += d
            torch.testing.assert_close(model.b.detach(), -sum_d)  # fresh: nothing in flight to predict
            torch.testing.assert_close(model.a.detach(), -sum_c if predicting else -(sum_c - c))
        opt.ctx.close()
        torch.testing.assert_close(model.a.detach(), -sum_c)
        ends.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(x, y) for x, y in zip(*ends, strict=True))


def test_job_parameters_are_the_jobs_between_steps_and_the_prediction_comes_back_exactly(
    secret_file: Path,
) -> None:
    # between steps the late layer holds the predicted point; inside job_parameters() it holds the job's
    # parameters (what every site agrees on: the update still in flight not applied), and afterwards the
    # predicted point again, bit for bit, so the next step is unchanged
    model, opt, _ = make(secret_file, {0: "late", 1: "instant"}, DENSE_STALE)
    sum_c = torch.zeros(20)
    for t in range(3):
        c, d = coeffs(t)
        model.loss(c, d).backward()
        opt.step()
        opt.zero_grad()
        sum_c += c
        predicted = model.a.detach().clone()
        torch.testing.assert_close(predicted, -sum_c)
        with opt.ctx.job_parameters():
            torch.testing.assert_close(model.a.detach(), -(sum_c - c))
        assert torch.equal(model.a.detach(), predicted)
    opt.ctx.close()
    torch.testing.assert_close(model.a.detach(), -sum_c)
    with opt.ctx.job_parameters():  # nothing predicted after close(): the job's parameters as they are
        torch.testing.assert_close(model.a.detach(), -sum_c)


def test_staleness_zero_waits_for_late_updates(secret_file: Path) -> None:
    model, opt, _ = make(
        secret_file, {0: "late", 1: "late"}, ClientConfig.dense_baseline(update_deadline_s=5.0)
    )
    c, d = coeffs(0)
    model.loss(c, d).backward()
    opt.step()
    torch.testing.assert_close(model.a.detach(), -c)
    torch.testing.assert_close(model.b.detach(), -d)
    opt.ctx.close()


def test_missing_update_raises_a_clear_timeout(secret_file: Path) -> None:
    cfg = ClientConfig.dense_baseline(update_deadline_s=0.2)
    model, opt, _ = make(secret_file, {0: "never"}, cfg)
    model.loss(*coeffs(0)).backward()
    with pytest.raises(WanrtTimeout) as info:
        opt.step()
    assert "iteration 0 layer 0" in str(info.value) and "mem://gw" in str(info.value)
    model.loss(*coeffs(1)).backward()
    with pytest.raises(wanrt.LocalProtocolError, match="failed earlier"):
        opt.step()
    opt.ctx.close()  # releases local resources only: no collective after a failed step


def test_step_without_backward_says_so(secret_file: Path) -> None:
    _, opt, _ = make(secret_file, {}, DENSE_STALE)
    with pytest.raises(StepWithoutBackward, match="without backward"):
        opt.step()
    opt.ctx.close()


def test_second_backward_before_step_is_refused(secret_file: Path) -> None:
    model, opt, _ = make(secret_file, {}, DENSE_STALE)
    model.loss(*coeffs(0)).backward()
    with pytest.raises(wanrt.LocalProtocolError, match="second gradient"):
        model.loss(*coeffs(1)).backward()
    opt.ctx.close()


def test_config_change_takes_effect_at_its_iteration(secret_file: Path) -> None:
    model, opt, link = make(secret_file, {}, DENSE_STALE)
    sizes: list[tuple[int, int]] = []
    opt.ctx.on_batch_size(lambda b: sizes.append((opt.ctx.iteration, b)))
    link.announce(ConfigChange(effective_iteration=2, density=0.5, batch_size=64, staleness=0))
    for t in range(3):
        assert opt.ctx.config.density == (1.0 if t < 2 else 0.5)
        model.loss(*coeffs(t)).backward()
        opt.step()
        opt.zero_grad()
    assert sizes == [(2, 64)]
    assert opt.ctx.config.staleness == 0
    # iteration 2 was compressed at the new density: half of the blocks of each layer
    it2 = [p for it, _, p in link.pushed if it == 2]
    assert it2 and all(p.nnz < p.dense_len for p in it2)
    opt.ctx.close()


def test_the_leader_reports_each_iterations_timing(secret_file: Path) -> None:
    model, opt, link = make(secret_file, {0: "late", 1: "instant"}, DENSE_STALE)
    opt.ctx.set_batch_size(32)
    for t in range(4):
        c, d = coeffs(t)
        model.loss(c, d).backward()
        opt.step()
        opt.zero_grad()
    seen = link.telemetry_seen
    assert [it for it, _ in seen] == [1, 2, 3]  # the first step has no start to measure from
    for _, m in seen:
        assert m["iteration_s"] > 0 and 0.0 <= m["idle_frac"] <= 1.0
        assert m["compute_s"] + m["idle_s"] == pytest.approx(m["iteration_s"])
        assert m["batch_size"] == 32 and m["samples_per_s"] == pytest.approx(32 / m["iteration_s"])
        # what ran, so the scheduler reads idle with its payload before any decision of its own
        assert m["density"] == DENSE_STALE.density and m["staleness"] == DENSE_STALE.staleness
    assert any(m["idle_s"] > 0 for _, m in seen)  # layer a's update is late: the leader waited for it
    with pytest.raises(Exception, match="positive integer"):
        opt.ctx.set_batch_size(0)
    opt.ctx.close()


def test_a_sites_batch_weight_scales_what_it_pushes_from_its_iteration_on(secret_file: Path) -> None:
    model, opt, link = make(secret_file, {}, ClientConfig.dense_baseline(staleness=0, update_deadline_s=5.0))
    link.announce(ConfigChange(effective_iteration=2, batch_weight=0.5))
    for t in range(3):
        model.loss(*coeffs(t)).backward()
        opt.step()
        opt.zero_grad()
    pushed = {(it, layer): p for it, layer, p in link.pushed}
    for t in range(3):
        c, d = coeffs(t)  # the gradient of each layer is exactly its coefficient
        want = 0.5 if t >= 2 else 1.0
        np.testing.assert_allclose(pushed[(t, 0)].to_dense(), want * c.numpy(), rtol=1e-6)
        np.testing.assert_allclose(pushed[(t, 1)].to_dense(), want * d.numpy(), rtol=1e-6)
    opt.ctx.close()
