"""A site of several ranks leases shards as one holder: the leader asks, shares each grant with its ranks,
and every rank trains its own equal-length stripe of each shard."""

from __future__ import annotations

import multiprocessing
import queue
import threading
from collections import Counter
from pathlib import Path

import pytest

from scheduler.sharding import ShardingConfig, ShardService
from tests.wanrt.client.test_shard_sampler import ServiceSource
from wanrt.client.shard_sampler import ShardSampler, ShardsRefused
from wanrt.errors import ConfigError
from wanrt.protocol import ShardGrant


class QueueRelay:
    """The site's broadcast, between threads: the leader puts every grant once per follower."""

    def __init__(
        self, followers: list[queue.Queue[ShardGrant]], mine: queue.Queue[ShardGrant] | None
    ) -> None:
        self.followers, self.mine = followers, mine

    def share(self, grant: ShardGrant | None) -> ShardGrant:
        if grant is not None:
            for q in self.followers:
                q.put(grant)
            return grant
        assert self.mine is not None
        return self.mine.get(timeout=30)


def _site(svc: ShardService, ranks: int, n: int) -> list[ShardSampler]:
    qs: list[queue.Queue[ShardGrant]] = [queue.Queue() for _ in range(ranks - 1)]
    out = [ShardSampler(ServiceSource(svc), n, stripe=(0, ranks), relay=QueueRelay(qs, None), retry_s=0.01)]
    for r in range(1, ranks):
        out.append(ShardSampler(None, n, stripe=(r, ranks), relay=QueueRelay([], qs[r - 1]), retry_s=0.01))
    return out


def _pass(sampler: ShardSampler, batch: int, got: list[int]) -> None:
    cur: list[int] = []
    for i in sampler:
        cur.append(i)
        if len(cur) == batch:
            got += cur
            sampler.step_done(len(cur))
            cur = []
    got += cur
    sampler.step_done(len(cur))


def test_three_ranks_train_disjoint_stripes_that_cover_each_epoch() -> None:
    svc = ShardService(ShardingConfig(shard_size=10, epochs=2))
    samplers = _site(svc, 3, 95)
    for epoch in range(2):
        got: list[list[int]] = [[] for _ in samplers]
        threads = [threading.Thread(target=_pass, args=(s, 4, g)) for s, g in zip(samplers, got, strict=True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len({len(g) for g in got}) == 1  # equal stripes: the ranks step together
        seen = Counter(i for g in got for i in g)
        assert set(seen) == set(range(95))
        assert sum(seen.values()) - 95 <= 10 * 2  # padding: at most ranks-1 per shard
        assert all(s.epoch == epoch + 1 for s in samplers)
    assert svc.complete and svc.epoch == 1 and svc.stats.repeated == 0


def test_a_leader_failure_reaches_its_followers_instead_of_a_hang() -> None:
    svc = ShardService(ShardingConfig(shard_size=10))
    svc.request("a", 0, epoch=0, dataset_len=50, want=1, fresh=False, now=0.0)  # the job's length is 50
    leader, follower = _site(svc, 2, 60)
    errors: list[BaseException] = []

    def run(s: ShardSampler) -> None:
        try:
            list(s)
        except ShardsRefused as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(s,)) for s in (leader, follower)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(errors) == 2


def test_stripes_need_a_relay_and_a_source_on_the_leader_only() -> None:
    svc = ShardService(ShardingConfig())
    with pytest.raises(ConfigError):
        ShardSampler(ServiceSource(svc), 10, stripe=(0, 2))
    with pytest.raises(ConfigError):
        ShardSampler(ServiceSource(svc), 10, stripe=(1, 2), relay=QueueRelay([], queue.Queue()))
    with pytest.raises(ConfigError):
        ShardSampler(None, 10)


def _gloo_rank(rank: int, store: str, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    import torch
    import torch.distributed as dist

    from wanrt.client.site.shard_grants import TorchGrantRelay

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        relay = TorchGrantRelay(None, torch.device("cpu"))
        sent = [
            ShardGrant(0, 7, 2, "granted", ((3, 30, 40), (9, 90, 95))),
            ShardGrant(0, 8, 2, "drained", ()),
        ]
        for g in sent:
            got = relay.share(g if rank == 0 else None)
            out.put((rank, got == g))
    finally:
        dist.destroy_process_group()


def test_the_torch_relay_carries_grants_over_a_real_gloo_group(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue = ctx.Queue()  # type: ignore[type-arg]
    procs = [ctx.Process(target=_gloo_rank, args=(r, str(tmp_path / "store"), out)) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert all(p.exitcode == 0 for p in procs)
    results = [out.get(timeout=5) for _ in range(4)]
    assert sorted(results) == [(0, True), (0, True), (1, True), (1, True)]
