"""Epochs of data-parallel training over data shards, with ranks killed and restarted, on virtual time.

It measures what AntDT §IV-C claims for Stateful Dynamic Data Sharding, by driving the very
:class:`~scheduler.sharding.service.ShardService` the scheduler daemon runs, against two obvious
alternatives fed with identical rank speeds and identical kill times (a paired comparison):

* ``dds``    — ours: TODO/DOING/DONE shards; a killed rank's DOING shards go back to TODO (release, one
  message latency after the kill), a restarted rank asks ``fresh``.
* ``queue``  — a dynamic queue without states (at-most-once): a shard handed out is forgotten, so the
  shards a killed rank held are never trained in that epoch.
* ``static`` — the even partition (each rank its N/R contiguous shards, as DistributedSampler does) without
  a data state: a restarted rank starts its partition of the epoch again, and the epoch lasts as long as
  its slowest rank (§IV-C2's argument for dynamic allocation).

The trainer side is modelled as :class:`~wanrt.client.shard_sampler.ShardSampler` behaves: ``want``
shards leased at a time, batches of ``batch`` samples, a shard reported DONE after the step that consumed
its last sample. Which (epoch, shard) pairs a rank trained in full is recorded on the trainer side, so
``lost`` is counted from what was trained, not from the service's own bookkeeping.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from scheduler.sharding.config import ShardingConfig
from scheduler.sharding.service import Grant, ShardService

__all__ = ["SCHEMES", "EpochsConfig", "EpochsResult", "run"]

SCHEMES = ("dds", "queue", "static")


@dataclass(frozen=True)
class EpochsConfig:
    samples: int = 20_000
    shard_size: int = 100
    ranks: int = 8
    epochs: int = 2
    batch: int = 32
    samples_per_s: float = 200.0  # a rank's mean throughput
    heterogeneity: float = 0.5  # throughputs uniform in mean × [1 − h, 1 + h]
    kills: int = 4  # ranks killed at random times during the run
    downtime_s: float = 20.0  # until the killed rank is back (pod restart)
    latency_s: float = 0.05  # trainer → gateway → scheduler, one way
    retry_s: float = 0.5
    want: int = 1
    seed: int = 0


@dataclass
class EpochsResult:
    scheme: str
    time_s: float = 0.0
    lost: int = 0  # (epoch, shard) pairs nobody trained in full
    trained_twice: int = 0  # (epoch, shard) pairs trained in full more than once
    repeated: int = 0  # the service's count: shards DONE after being handed out more than once
    samples_trained: int = 0  # samples through finished steps, counting repeats and partial shards
    kills: int = 0
    shards_per_rank: list[int] = field(default_factory=list)


class _Source(Protocol):
    def request(self, rank: int, epoch: int, fresh: bool, now: float) -> Grant: ...

    def done(self, rank: int, epoch: int, ids: list[int], now: float) -> None: ...

    def release(self, rank: int, now: float) -> None: ...

    def expire(self, now: float) -> None: ...


class _Dds:
    def __init__(self, c: EpochsConfig) -> None:
        self.c = c
        # a lease long enough never to expire a live rank here: kills are announced by release
        self.svc = ShardService(
            ShardingConfig(shard_size=c.shard_size, epochs=c.epochs, lease_s=3600.0, max_outstanding=8)
        )

    def request(self, rank: int, epoch: int, fresh: bool, now: float) -> Grant:
        return self.svc.request(
            "s", rank, epoch=epoch, dataset_len=self.c.samples, want=self.c.want, fresh=fresh, now=now
        )

    def done(self, rank: int, epoch: int, ids: list[int], now: float) -> None:
        self.svc.done("s", rank, epoch, ids, now)

    def release(self, rank: int, now: float) -> None:
        self.svc.release("s", rank)

    def expire(self, now: float) -> None:
        self.svc.expire(now)


class _Untracked:
    """The baselines without a lease table: nothing to report back, nothing expires."""

    c: EpochsConfig

    def grant(self, sid: int, epoch: int) -> Grant:
        start = sid * self.c.shard_size
        return Grant("granted", epoch, ((sid, start, min(start + self.c.shard_size, self.c.samples)),))

    def done(self, rank: int, epoch: int, ids: list[int], now: float) -> None:
        return None

    def release(self, rank: int, now: float) -> None:
        return None

    def expire(self, now: float) -> None:
        return None


class _Queue(_Untracked):
    """Hands each shard out once and forgets it; an epoch ends when its queue is empty."""

    def __init__(self, c: EpochsConfig) -> None:
        self.c = c
        self.k = math.ceil(c.samples / c.shard_size)
        self.order = ShardService(ShardingConfig(shard_size=c.shard_size))
        self.order.n_shards = self.k
        self.epoch = -1
        self.q: deque[int] = deque()

    def request(self, rank: int, epoch: int, fresh: bool, now: float) -> Grant:
        if epoch >= self.c.epochs or epoch < self.epoch:
            return Grant("finished", epoch)
        if epoch > self.epoch:
            if self.q:
                return Grant("wait", epoch)
            self.epoch, self.q = epoch, deque(self.order.order(epoch))
        if not self.q:
            return Grant("drained", epoch)
        sid = self.q.popleft()
        return self.grant(sid, epoch)


class _Static(_Untracked):
    """Rank r trains shards [r·K/R, (r+1)·K/R) of every epoch, from the start again after a restart."""

    def __init__(self, c: EpochsConfig) -> None:
        self.c = c
        k = math.ceil(c.samples / c.shard_size)
        self.parts = [list(range(r * k // c.ranks, (r + 1) * k // c.ranks)) for r in range(c.ranks)]
        self.next = [0] * c.ranks
        self.epoch = [0] * c.ranks

    def request(self, rank: int, epoch: int, fresh: bool, now: float) -> Grant:
        if epoch >= self.c.epochs:
            return Grant("finished", epoch)
        if fresh or epoch != self.epoch[rank]:
            self.epoch[rank], self.next[rank] = epoch, 0
        part = self.parts[rank]
        if self.next[rank] >= len(part):
            return Grant("drained", epoch)
        sid = part[self.next[rank]]
        self.next[rank] += 1
        return self.grant(sid, epoch)


@dataclass
class _Rank:
    speed: float
    epoch: int = 0
    alive: bool = True
    incarnation: int = 0
    fresh: bool = True
    waiting: bool = False  # a request is on its way
    stopped: bool = False
    buffer: deque[tuple[int, int, int]] = field(default_factory=deque)  # (epoch, shard, samples left)
    partial: int = 0  # samples of the next step already taken from the buffer


def run(c: EpochsConfig, scheme: str) -> EpochsResult:
    """One run of ``scheme`` (see :data:`SCHEMES`); rank speeds and kill times come from ``c.seed`` only."""
    rng = np.random.default_rng(c.seed)
    speeds = c.samples_per_s * rng.uniform(1 - c.heterogeneity, 1 + c.heterogeneity, c.ranks)
    # kill times spread over the run a dds run would take without kills
    horizon = c.epochs * c.samples / speeds.sum()
    kill_at = np.sort(rng.uniform(0.05 * horizon, 0.9 * horizon, c.kills))
    kill_rank = rng.integers(0, c.ranks, c.kills)
    factories: dict[str, Callable[[EpochsConfig], _Source]] = {
        "dds": _Dds,
        "queue": _Queue,
        "static": _Static,
    }
    src = factories[scheme](c)
    res = EpochsResult(scheme, shards_per_rank=[0] * c.ranks)
    ranks = [_Rank(float(s)) for s in speeds]
    trained: dict[tuple[int, int], int] = {}
    events: list[tuple[float, int, str, int, Any]] = []
    seq = 0

    def at(t: float, kind: str, r: int, data: Any = None) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, r, data))

    def ask(r: int, now: float) -> None:
        rk = ranks[r]
        rk.waiting = True
        at(now + c.latency_s, "request", r, (rk.incarnation, rk.epoch, rk.fresh))
        rk.fresh = False

    def step_or_ask(r: int, now: float) -> None:
        rk = ranks[r]
        if not rk.alive or rk.stopped or rk.waiting:
            return
        have = sum(left for _, _, left in rk.buffer)
        if have >= c.batch:
            at(now + c.batch / rk.speed, "step", r, rk.incarnation)
        else:
            ask(r, now)

    for r in range(c.ranks):
        ask(r, 0.0)
    for t, r in zip(kill_at, kill_rank, strict=True):
        at(float(t), "kill", int(r))
    now = 0.0
    while events:
        now, _, kind, r, data = heapq.heappop(events)
        rk = ranks[r]
        if kind == "kill":
            if not rk.alive or rk.stopped:
                continue
            rk.alive, rk.waiting = False, False
            rk.buffer.clear()
            rk.incarnation += 1
            res.kills += 1
            at(now + c.latency_s, "release", r)
            at(now + c.downtime_s, "restart", r)
        elif kind == "release":
            src.release(r, now)
        elif kind == "restart":
            rk.alive, rk.fresh = True, True
            step_or_ask(r, now)
        elif kind == "request":
            incarnation, epoch, fresh = data
            src.expire(now)
            g = src.request(r, epoch, fresh, now)
            at(now + c.latency_s, "grant", r, (incarnation, g))
        elif kind == "grant":
            incarnation, g = data
            if incarnation != rk.incarnation or not rk.alive:
                continue  # the answer reached a dead process
            rk.waiting = False
            if g.status == "granted":
                for sid, start, stop in g.shards:
                    rk.buffer.append((g.epoch, sid, stop - start))
                    res.shards_per_rank[r] += 1
                step_or_ask(r, now)
            elif g.status in ("drained", "finished"):
                rk.epoch = max(rk.epoch, g.epoch + 1)
                if rk.buffer:  # the tail of the epoch: train what it has (a last, short batch)
                    at(now + sum(x[2] for x in rk.buffer) / rk.speed, "step", r, rk.incarnation)
                elif g.status == "finished" and rk.epoch >= c.epochs:
                    rk.stopped = True
                else:
                    ask(r, now)
            else:  # wait
                if rk.buffer:
                    at(now + sum(x[2] for x in rk.buffer) / rk.speed, "step", r, rk.incarnation)
                else:
                    rk.waiting = True
                    at(now + c.retry_s, "retry", r, rk.incarnation)
        elif kind == "retry":
            if data == rk.incarnation and rk.alive:
                rk.waiting = False
                ask(r, now)
        elif kind == "step":
            if data != rk.incarnation or not rk.alive:
                continue
            take = c.batch
            finished: dict[int, list[int]] = {}
            while take > 0 and rk.buffer:
                ep, sid, left = rk.buffer[0]
                n = min(left, take)
                take -= n
                res.samples_trained += n
                if n == left:
                    rk.buffer.popleft()
                    finished.setdefault(ep, []).append(sid)
                    trained[(ep, sid)] = trained.get((ep, sid), 0) + 1
                else:
                    rk.buffer[0] = (ep, sid, left - n)
            for ep, ids in finished.items():
                at(now + c.latency_s, "done", r, (ep, ids))
            res.time_s = max(res.time_s, now)
            step_or_ask(r, now)
        elif kind == "done":
            ep, ids = data
            src.done(r, ep, ids, now)
    k = math.ceil(c.samples / c.shard_size)
    res.lost = sum(1 for e in range(c.epochs) for s in range(k) if (e, s) not in trained)
    res.trained_twice = sum(1 for n in trained.values() if n > 1)
    if isinstance(src, _Dds):
        res.repeated = src.svc.stats.repeated
        assert src.svc.lost() == 0
    return res
