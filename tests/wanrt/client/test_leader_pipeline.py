"""The leader's worker pipeline: layers run in issue order, the step's last layer on the calling thread when
the worker has nothing left (wanrt/client/leader/worker.py), and every failure surfaces at drain()."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.wanrt.client.test_context_local import coeffs, make
from wanrt.client import ClientConfig
from wanrt.client.leader.worker import LeaderPipeline
from wanrt.errors import KernelError


class Recorder:
    """A job that records (layer, thread) and can be held at a gate or made to fail."""

    def __init__(self) -> None:
        self.ran: list[tuple[int, str]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail_layer: int | None = None

    def __call__(self, iteration: int, layer: int, work: Any, grad: torch.Tensor) -> None:
        self.gate.wait(10)
        self.ran.append((layer, threading.current_thread().name))
        if layer == self.fail_layer:
            raise RuntimeError(f"layer {layer} failed")


def test_last_layer_runs_here_when_the_worker_is_idle() -> None:
    job = Recorder()
    pipe = LeaderPipeline(job)
    try:
        pipe.submit(0, 1, None, torch.zeros(1))
        pipe.drain()
        pipe.submit(1, 0, None, torch.zeros(1), here=True)
        assert job.ran[-1] == (0, threading.current_thread().name)  # done before submit returned
        pipe.drain()
    finally:
        pipe.close()
    assert job.ran[0][1].startswith("wanrt-leader")


def test_last_layer_queues_behind_a_busy_worker_in_issue_order() -> None:
    job = Recorder()
    job.gate.clear()  # the worker is held inside layer 2's job
    pipe = LeaderPipeline(job)
    try:
        pipe.submit(0, 2, None, torch.zeros(1))
        pipe.submit(0, 1, None, torch.zeros(1))
        pipe.submit(0, 0, None, torch.zeros(1), here=True)
        assert job.ran == []  # not run here: the worker still has layers before it
        job.gate.set()
        pipe.drain()
    finally:
        pipe.close()
    assert [layer for layer, _ in job.ran] == [2, 1, 0]
    assert all(name.startswith("wanrt-leader") for _, name in job.ran)


@pytest.mark.parametrize("here", [False, True])
def test_a_failure_surfaces_at_drain_not_at_submit(here: bool) -> None:
    job = Recorder()
    job.fail_layer = 0
    pipe = LeaderPipeline(job)
    try:
        pipe.submit(0, 0, None, torch.zeros(1), here=here)  # inside a backward hook: must not raise
        with pytest.raises(RuntimeError, match="layer 0 failed"):
            pipe.drain()
        pipe.drain()  # reported once
    finally:
        pipe.close()


@pytest.mark.usefixtures("single_rank_group")
def test_through_the_client_layers_push_in_issue_order_and_a_bad_last_layer_fails_the_step(
    secret_file: Path,
) -> None:
    model, opt, link = make(secret_file, {}, ClientConfig(density=0.25, staleness=0, update_deadline_s=5.0))
    for t in range(2):
        model.loss(*coeffs(t)).backward()
        opt.step()
        opt.zero_grad()
    # reverse parameter order: b (layer 1) first, a (layer 0, the step's last: run by the training thread)
    assert [(it, layer) for it, layer, _ in link.pushed] == [(0, 1), (0, 0), (1, 1), (1, 0)]
    c, d = coeffs(2)
    c[3] = float("nan")
    model.loss(c, d).backward()  # the last layer's compression fails inside the hook: kept, not raised here
    with pytest.raises(KernelError, match="NaN"):
        opt.step()
