"""The ShardSampler against an in-process shard service: it yields every sample of the shards it leases,
reports a shard only once a finished step consumed all of it, and a restarted rank neither skips nor
repeats anything but the shards its dead predecessor held."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from scheduler.sharding import ShardingConfig, ShardService
from wanrt.client.shard_sampler import ShardSampler, ShardsRefused
from wanrt.errors import ConfigError, WanrtTimeout
from wanrt.protocol import ShardGrant


class ServiceSource:
    """The link as the sampler sees it, answered at once by a real ShardService (site ``site``)."""

    def __init__(self, svc: ShardService, site: str = "a") -> None:
        self.svc, self.site = svc, site
        self.grants: list[ShardGrant] = []
        self.reports: list[tuple[int, ...]] = []
        self.silent = False

    def request_shards(
        self, rank: int, request: int, epoch: int, dataset_len: int, want: int, fresh: bool
    ) -> None:
        if self.silent:
            return
        g = self.svc.request(
            self.site, rank, epoch=epoch, dataset_len=dataset_len, want=want, fresh=fresh, now=0.0
        )
        self.grants.append(ShardGrant(rank, request, g.epoch, g.status, g.shards))

    def report_shards(self, rank: int, epoch: int, shards: tuple[int, ...]) -> None:
        self.reports.append(shards)
        self.svc.done(self.site, rank, epoch, shards, 0.0)

    def next_grant(self, timeout: float) -> ShardGrant | None:
        return self.grants.pop(0) if self.grants else None


def _train(sampler: ShardSampler, batch: int, steps: int | None = None) -> list[int]:
    """Run one pass in batches, calling step_done after each; stop after ``steps`` steps (a crash)."""
    out: list[int] = []
    cur: list[int] = []
    for i in sampler:
        cur.append(i)
        if len(cur) == batch:
            out += cur
            sampler.step_done(len(cur))
            cur = []
            if steps is not None and len(out) // batch == steps:
                return out
    out += cur
    sampler.step_done(len(cur))
    return out


def test_one_pass_covers_the_epoch_and_reports_each_shard_once() -> None:
    svc = ShardService(ShardingConfig(shard_size=10, epochs=1))
    src = ServiceSource(svc)
    sampler = ShardSampler(src, 95, seed=1)
    seen = _train(sampler, batch=7)
    assert sorted(seen) == list(range(95)) and seen != sorted(seen)
    assert sorted(s for r in src.reports for s in r) == list(range(10))
    assert svc.complete and sampler.epoch == 1 and sampler.in_flight == 0
    assert _train(sampler, batch=7) == []  # epoch 1 is beyond the configured epochs


def test_a_shard_is_reported_only_when_all_its_samples_went_through_a_step() -> None:
    svc = ShardService(ShardingConfig(shard_size=10))
    src = ServiceSource(svc)
    sampler = ShardSampler(src, 40, shuffle=False)
    it = iter(sampler)
    first = [next(it) for _ in range(12)]  # the loader built a batch reaching into the second shard
    assert first[:10] == list(range(first[0], first[0] + 10))
    sampler.step_done(9)
    assert src.reports == []
    sampler.step_done(3)
    assert src.reports == [(first[0] // 10,)] and sampler.in_flight == 1


def test_a_restarted_rank_continues_the_epoch_and_only_its_lost_shards_repeat() -> None:
    svc = ShardService(ShardingConfig(shard_size=10, epochs=1))
    dead = ShardSampler(ServiceSource(svc), 100, want=2)
    before = _train(dead, batch=4, steps=4)  # 16 samples: one shard reported, the next in flight
    held = svc.held_by("a", 0)
    assert len(held) == 1
    again = ShardSampler(ServiceSource(svc), 100, want=2)  # same site and rank, a new process
    after = _train(again, batch=4)
    seen = Counter(before + after)
    assert set(seen) == set(range(100))
    assert {i // 10 for i, c in seen.items() if c > 1} <= held
    assert svc.stats.repeated == 1 and svc.stats.released == 1 and svc.complete


def test_a_pass_ends_early_while_samples_are_in_flight_and_the_next_pass_goes_on() -> None:
    svc = ShardService(ShardingConfig(shard_size=10, max_outstanding=1))
    other = svc.request("b", 0, epoch=0, dataset_len=20, want=1, fresh=False, now=0.0)
    sampler = ShardSampler(ServiceSource(svc), 20, retry_s=0.01)
    first = list(sampler)  # one shard, then "wait" with it in flight: the pass ends
    assert len(first) == 10 and sampler.epoch == 0 and sampler.in_flight == 1
    sampler.step_done(10)
    svc.release("b")  # b dies: its shard comes back and this rank takes it on the next pass
    second = list(sampler)
    assert sorted(first + second) == list(range(20)) and other.shards[0][0] * 10 in second
    sampler.step_done(10)
    assert list(sampler) == [] and sampler.epoch == 1


def test_refusals_and_silence_raise_typed_errors() -> None:
    svc = ShardService(ShardingConfig(shard_size=10))
    svc.request("b", 0, epoch=0, dataset_len=50, want=1, fresh=False, now=0.0)
    with pytest.raises(ShardsRefused):
        list(ShardSampler(ServiceSource(svc), 60))
    src = ServiceSource(svc)
    src.silent = True
    with pytest.raises(WanrtTimeout):
        list(ShardSampler(src, 50, timeout_s=0.05))
    with pytest.raises(ConfigError):
        ShardSampler(src, 0)
    with pytest.raises(ConfigError):
        ShardSampler(src, 10).step_done(-1)


@pytest.mark.usefixtures("single_rank_group")
def test_ctx_shards_rides_the_leader_s_link_once_the_optimizer_exists(secret_file: Path) -> None:
    import torch

    import wanrt
    from tests.wanrt.client.fake_link import ScriptedLink
    from wanrt.client import ClientConfig, SparseOptimizer
    from wanrt.client.link.api import LinkSpec
    from wanrt.errors import LocalProtocolError

    svc = ShardService(ShardingConfig(shard_size=10, epochs=1))

    def factory(spec: LinkSpec) -> ScriptedLink:
        link = ScriptedLink(spec)
        src = ServiceSource(svc)
        link.request_shards = src.request_shards  # type: ignore[attr-defined]
        link.report_shards = src.report_shards  # type: ignore[attr-defined]
        link.next_grant = src.next_grant  # type: ignore[attr-defined]
        return link

    ctx = wanrt.client.init(
        "mem://gw", site="a", job="j", secret_file=secret_file, config=ClientConfig(), link_factory=factory
    )
    try:
        with pytest.raises(LocalProtocolError, match="SparseOptimizer"):
            ctx.shards(30)
        SparseOptimizer([("w", torch.nn.Parameter(torch.zeros(16)))], "sgd", lr=0.1, ctx=ctx)
        sampler = ctx.shards(30, seed=4)
        seen = list(sampler)
        sampler.step_done(len(seen))
        assert sorted(seen) == list(range(30)) and svc.complete
    finally:
        ctx.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dataloader_with_prefetching_workers_trains_each_epoch_once(workers: int) -> None:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    # 2 workers × 2 prefetched batches of 8 = 32 samples in flight: about 4 shards of 10, under the cap
    svc = ShardService(ShardingConfig(shard_size=10, epochs=2, max_outstanding=8))
    sampler = ShardSampler(ServiceSource(svc), 95, retry_s=0.01)
    loader = DataLoader(TensorDataset(torch.arange(95)), batch_size=8, sampler=sampler, num_workers=workers)
    for epoch in range(2):
        seen: list[int] = []
        for (x,) in loader:
            seen += x.tolist()
            sampler.step_done(len(x))
        assert sorted(seen) == list(range(95)) and sampler.epoch == epoch + 1
    assert svc.complete and svc.epoch == 1 and svc.stats.repeated == 0


def test_samples_of_a_left_out_step_are_trained_again_before_their_shard_is_reported() -> None:
    """Steps whose gradients were left out (a pending parameter snapshot): the shards they touched are
    not reported DONE on their strength; they are trained again, then reported; the epoch completes."""
    svc = ShardService(ShardingConfig(shard_size=10, epochs=1))
    src = ServiceSource(svc)
    left_out = {"now": True}
    sampler = ShardSampler(src, 60, shuffle=False, discarded=lambda: left_out["now"])
    out: list[int] = []
    cur: list[int] = []
    steps = 0
    reported_while_left_out: list[tuple[int, ...]] = []
    for i in sampler:
        cur.append(i)
        if len(cur) == 7:
            out += cur
            steps += 1
            left_out["now"] = steps <= 2  # the first two steps (14 samples) were pushed empty
            before = len(src.reports)
            sampler.step_done(len(cur))
            if left_out["now"]:
                reported_while_left_out += src.reports[before:]
            cur = []
    left_out["now"] = False
    out += cur
    sampler.step_done(len(cur))
    assert reported_while_left_out == []
    seen = Counter(out)
    assert set(seen) == set(range(60))
    again = {i // 10 for i, c in seen.items() if c > 1}
    first_two = {i // 10 for i in out[:14]}
    assert again == first_two and len(again) == 2  # samples 0..13: shards 0 and 1, each trained twice
    assert all(seen[i] == 2 for s in again for i in range(10 * s, 10 * s + 10))
    assert sampler.retrained == 2
    assert sorted(s for r in src.reports for s in r) == list(range(6))  # each shard reported once
    assert svc.complete and sampler.in_flight == 0


def test_without_left_out_steps_nothing_is_trained_again() -> None:
    svc = ShardService(ShardingConfig(shard_size=10, epochs=1))
    sampler = ShardSampler(ServiceSource(svc), 45, discarded=lambda: False)
    assert sorted(_train(sampler, batch=4)) == list(range(45))
    assert sampler.retrained == 0 and svc.complete
