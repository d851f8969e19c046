"""Two sites in one process over an in-memory hub that sums their pushes as the gateways do: while site b's
snapshot is pending, the result of every iteration is site a's push alone (nothing of b's gradients
reaches a), and once b installed the snapshot both sites end with identical parameters. Each site's loop
runs in its own thread (the hub is lock-step at staleness 0, as the rounds are)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import wanrt
from tools.harness.summing_hub import Hub, HubLink
from wanrt.client import ClientConfig, SparseOptimizer
from wanrt.client.context import Context
from wanrt.client.link.api import ResyncStarted, SnapshotArrived
from wanrt.client.link.param_resync import Snapshot

pytestmark = pytest.mark.usefixtures("single_rank_group")

SITES = ("a", "b")
LENGTHS = (48, 80)
STEPS = 8
LR = 0.1


def _site(
    site: str, hub: Hub, secret_file: Path
) -> tuple[Context, list[torch.nn.Parameter], SparseOptimizer]:
    ctx = wanrt.client.init(
        "mem://hub",
        site=site,
        job="j",
        secret_file=secret_file,
        config=ClientConfig.dense_baseline(staleness=0, update_deadline_s=20.0),
        link_factory=lambda spec: HubLink(spec, hub),
    )
    torch.manual_seed(7 if site == "a" else 99)  # b's own initial parameters differ from the job's
    params = [torch.nn.Parameter(torch.randn(n)) for n in LENGTHS]
    opt = SparseOptimizer([(f"p{i}", p) for i, p in enumerate(params)], "sgd", lr=LR, ctx=ctx)
    return ctx, params, opt


def _loss(site: str, t: int, params: list[torch.nn.Parameter]) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * ord(site) + t)
    # gradients that depend on the parameters: computed at b's own parameters they would be wrong
    return sum(((p - torch.randn(p.shape, generator=g)) ** 2).sum() for p in params)  # type: ignore[return-value]


def test_a_pending_site_s_gradients_never_reach_the_other_site(secret_file: Path) -> None:
    hub = Hub(SITES)
    ctx_a, params_a, opt_a = _site("a", hub, secret_file)
    ctx_b, params_b, opt_b = _site("b", hub, secret_file)
    after_a: dict[int, list[np.ndarray]] = {}  # a's parameters after each step
    a_done = {k: threading.Event() for k in range(STEPS)}
    errors: list[BaseException] = []

    def run_a() -> None:
        try:
            for t in range(STEPS):
                _loss("a", t, params_a).backward()
                opt_a.step()
                opt_a.zero_grad()
                after_a[t] = [p.detach().numpy().copy() for p in params_a]
                a_done[t].set()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    def run_b() -> None:
        try:
            hub.links["b"].events.put(ResyncStarted(1))  # seen at step 0's end: pending from iteration 1
            for t in range(STEPS):
                if t == 4:  # the snapshot: a's parameters with every update below iteration 3
                    assert a_done[2].wait(20.0)
                    hub.links["b"].events.put(SnapshotArrived(Snapshot(3, frozenset(), after_a[2])))
                _loss("b", t, params_b).backward()
                opt_b.step()
                opt_b.zero_grad()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run_a), threading.Thread(target=run_b)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60.0)
    assert not errors, errors
    assert ctx_b.discarded_steps == 4 and ctx_b.resyncs == 1  # iterations 1-4, installed at step 4's end
    assert ctx_a.discarded_steps == 0
    for t in range(STEPS):
        for layer in range(len(LENGTHS)):
            b_push = hub.pushes[("b", t, layer)]
            result = hub.results[(t, layer)].to_dense()
            a_alone = hub.pushes[("a", t, layer)].to_dense()
            if 1 <= t <= 4:
                assert b_push.nnz_blocks == 0  # b pushed nothing ...
                np.testing.assert_array_equal(result, a_alone)  # ... so the result is a's push alone
            else:
                assert b_push.nnz_blocks > 0
                assert not np.array_equal(result, a_alone)
    # a's parameters moved by a's gradients alone in those iterations (the sum is averaged over the two
    # sites the result names: docs/resync_discard.md, "Averaging")
    for t in range(1, 5):
        for layer in range(len(LENGTHS)):
            step = hub.pushes[("a", t, layer)].to_dense() * np.float32(0.5)
            want = after_a[t - 1][layer] - np.float32(LR) * step
            np.testing.assert_allclose(after_a[t][layer], want, rtol=1e-6, atol=1e-6)
    # b installed the job's parameters and applied the held updates the snapshot lacked: both sites end equal
    for pa, pb in zip(params_a, params_b, strict=True):
        assert torch.equal(pa.detach(), pb.detach())
    ctx_a.close()
    ctx_b.close()
