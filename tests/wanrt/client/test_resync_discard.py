"""A site whose parameter snapshot is pending contributes nothing: every layer's push is empty, the
error-feedback residual keeps nothing of those steps, and once the snapshot is installed the pushes are
normal again (docs/kill_restart.md). One site, one rank, a scripted link; the gateway's side of an empty
push is tests/gateways/node/test_empty_push.py."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch

import wanrt
from tests.wanrt.client.fake_link import ScriptedLink
from wanrt.client import ClientConfig, SparseOptimizer
from wanrt.client.context import Context
from wanrt.client.link.api import (
    LinkSpec,
    ResyncAbandoned,
    ResyncStarted,
    ServeRequested,
    SnapshotArrived,
)
from wanrt.client.link.param_resync import Snapshot

pytestmark = pytest.mark.usefixtures("single_rank_group")

LENGTHS = (64, 96)


class InjectLink(ScriptedLink):
    def __init__(self, spec: LinkSpec, start: int) -> None:
        super().__init__(spec)
        self.start_iteration = start  # what a Welcome's restart_from sets on the real link
        self.served: list[object] = []

    def inject(self, event: object) -> None:
        with self._lock:
            self._ready.insert(0, event)  # type: ignore[arg-type]

    def send_params(self, frames: list[object]) -> None:
        self.served.extend(frames)


class Site:
    def __init__(self, secret_file: Path, *, start: int = 0) -> None:
        links: list[InjectLink] = []

        def factory(spec: LinkSpec) -> InjectLink:
            links.append(InjectLink(spec, start))
            return links[0]

        self.ctx: Context = wanrt.client.init(
            "mem://gw",
            site="b",
            job="j",
            secret_file=secret_file,
            # sparse with error feedback: the residual is what must not keep the discarded gradients
            config=ClientConfig(density=0.25, block_size=16, staleness=0, update_deadline_s=5.0),
            link_factory=factory,
        )
        torch.manual_seed(1)
        self.a = torch.nn.Parameter(torch.randn(LENGTHS[0]))
        self.b = torch.nn.Parameter(torch.randn(LENGTHS[1]))
        params = [("a", self.a), ("b", self.b)]
        self.opt = SparseOptimizer(params, "sgd", lr=0.1, ctx=self.ctx)
        self.link = links[0]

    def step(self) -> None:
        t = self.ctx.iteration
        g = torch.Generator().manual_seed(t)
        c, d = torch.randn(LENGTHS[0], generator=g), torch.randn(LENGTHS[1], generator=g)
        ((self.a * c).sum() + (self.b * d).sum()).backward()
        self.opt.step()
        self.opt.zero_grad()

    def pushed_blocks(self, iteration: int) -> list[int]:
        return [p.nnz_blocks for it, _, p in self.link.pushed if it == iteration]

    def residuals(self) -> list[np.ndarray | None]:
        compressor = self.ctx._compressor
        assert compressor is not None and compressor._ef is not None
        return [compressor._ef.residual(layer) for layer in range(len(LENGTHS))]


def test_pushes_are_empty_while_the_snapshot_is_pending_and_normal_after(
    secret_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    site = Site(secret_file)
    site.step()
    assert all(n > 0 for n in site.pushed_blocks(0))
    assert all(r is not None and np.any(r) for r in site.residuals())  # density 0.25: something left out

    caplog.set_level(logging.INFO, logger="wanrt.client.leader.resync_state")
    site.link.inject(ResyncStarted(1))
    site.step()  # iteration 1 was pushed before the leader heard of the resync (at this step's end)
    assert all(n > 0 for n in site.pushed_blocks(1))
    assert site.residuals() == [None, None]  # dropped at once: computed at parameters not the job's
    assert "parameter resync pending" in caplog.text
    for it in (2, 3):
        site.step()
        assert site.pushed_blocks(it) == [0, 0], it
        assert site.residuals() == [None, None]  # nothing of the discarded gradients is kept for later
    assert site.ctx.discarded_steps == 2

    rng = np.random.default_rng(5)
    snap = [rng.standard_normal(n).astype(np.float32) for n in LENGTHS]
    site.link.inject(SnapshotArrived(Snapshot(4, frozenset(), snap)))
    site.step()  # iteration 4 was pushed (empty) before the snapshot was seen; installed at its end
    assert site.pushed_blocks(4) == [0, 0]
    assert site.ctx.resyncs == 1 and site.ctx.discarded_steps == 3
    assert "were left out until the snapshot was installed (3 steps)" in caplog.text
    # installed: the parameters are the snapshot's (the empty pushes came back as empty updates)
    np.testing.assert_array_equal(site.a.detach().numpy(), snap[0])
    np.testing.assert_array_equal(site.b.detach().numpy(), snap[1])
    site.step()
    assert all(n > 0 for n in site.pushed_blocks(5))
    assert site.ctx.discarded_steps == 3
    # the residual holds iteration 5's leftovers only: what a fresh compressor would keep from it
    assert all(r is not None and np.any(r) for r in site.residuals())
    site.ctx.close()


def test_a_replacement_process_pushes_empty_from_its_first_iteration(secret_file: Path) -> None:
    """restart_from in the Welcome: pending before the gateway's resync notice arrives (no notice yet at
    the first step does not end it); a resync nobody serves (abandoned) ends it."""
    site = Site(secret_file, start=7)
    assert site.ctx.iteration == 7
    site.link.inject(ServeRequested(1, 7))  # a peer asks before this site's own resync notice arrived
    site.step()
    assert site.link.served == []  # its parameters are not the job's: it does not serve them
    site.step()
    assert site.pushed_blocks(7) == [0, 0] and site.pushed_blocks(8) == [0, 0]
    site.link.inject(ResyncStarted(7))
    site.step()
    assert site.pushed_blocks(9) == [0, 0]
    site.link.inject(ResyncAbandoned())
    site.step()  # iteration 10 pushed empty; the abandon is seen at its end
    assert site.pushed_blocks(10) == [0, 0]
    site.step()
    assert all(n > 0 for n in site.pushed_blocks(11))
    assert site.ctx.discarded_steps == 4 and site.ctx.resyncs == 0
    reported = [m.get("resync.empty_pushes") for _, m in site.link.telemetry_seen]
    assert reported and reported[-1] == 4.0  # the gateway forwards it as trainer.resync.empty_pushes
    assert site.link.served  # abandoned: it trains on its own parameters and answers as before
    site.ctx.close()


def test_a_shard_trained_in_a_left_out_step_is_trained_again_before_it_is_reported(secret_file: Path) -> None:
    """ctx.shards: the sampler learns from the context which steps were left out (every rank alike)."""
    from collections import Counter

    from scheduler.sharding import ShardingConfig, ShardService
    from tests.wanrt.client.test_shard_sampler import ServiceSource

    svc = ShardService(ShardingConfig(shard_size=10, epochs=1))
    src = ServiceSource(svc, site="b")
    site = Site(secret_file, start=3)  # a replacement process: pending from its first step
    link = site.link
    link.request_shards = src.request_shards  # type: ignore[attr-defined]
    link.report_shards = src.report_shards  # type: ignore[attr-defined]
    link.next_grant = src.next_grant  # type: ignore[attr-defined]
    sampler = site.ctx.shards(40, shuffle=False)
    seen: list[int] = []
    batch: list[int] = []
    rng = np.random.default_rng(0)
    snap = [rng.standard_normal(n).astype(np.float32) for n in LENGTHS]
    for index in sampler:
        batch.append(index)
        if len(batch) < 6:
            continue
        if site.ctx.iteration == 4:
            link.inject(SnapshotArrived(Snapshot(4, frozenset(), snap)))  # installed at step 4's end
        site.step()
        sampler.step_done(len(batch))
        seen += batch
        batch = []
    site.step()
    sampler.step_done(len(batch))
    seen += batch
    assert site.ctx.discarded_steps == 2 and site.ctx.resyncs == 1  # iterations 3 and 4, 12 samples
    counts = Counter(seen)
    again = {i // 10 for i, c in counts.items() if c > 1}
    assert again == {i // 10 for i in seen[:12]} and len(again) == 2  # the two shards of the first 12
    assert sampler.retrained == 2 and svc.complete
    assert sorted(s for r in src.reports for s in r) == [0, 1, 2, 3]
    site.ctx.close()
