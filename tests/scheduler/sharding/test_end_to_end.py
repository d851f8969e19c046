"""Dynamic data sharding end to end: trainer processes (the real client link and ShardSampler) talk through
real gateway daemons to a real scheduler daemon on unix sockets. A trainer SIGKILLed mid-epoch and
restarted loses no shard; a restarted scheduler keeps the job's progress."""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from scheduler.daemon_config import SchedulerDaemonConfig
from scheduler.service.daemon import SchedulerDaemon
from scheduler.service.daemon import serving as scheduler
from scheduler.sharding import ShardingConfig
from tools.harness.daemon_cluster import JOB, SECRET, TEST_TIMEOUTS, running, short_dir, site_configs

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tools"))
from shard_trainer import TrainerProcess  # noqa: E402  (tools/ is not a package)

N, SHARD, BATCH = 200, 10, 4


def _sched_cfg(d: Path, epochs: int = 1, **sharding: Any) -> SchedulerDaemonConfig:
    return SchedulerDaemonConfig(
        job=JOB,
        sites=("a", "b"),
        secret=SECRET,
        listen=f"unix://{d}/sched.sock",
        policy="fixed",
        timeouts=TEST_TIMEOUTS,
        sharding=ShardingConfig(shard_size=SHARD, lease_s=60.0, epochs=epochs, max_outstanding=2, **sharding),
    )


class Trainer(TrainerProcess):
    """A trainer process over this test's dataset (N samples, batches of BATCH)."""

    @classmethod
    async def start(cls, url: str, site: str, *extra: str) -> Trainer:  # type: ignore[override]
        p = await TrainerProcess.start(url, site, N, BATCH, *extra)
        return cls(p.proc)


def _check_coverage(*trainers: Trainer) -> Counter[int]:
    seen = Counter(i for t in trainers for i in t.samples())
    assert set(seen) == set(range(N))  # no sample lost
    return seen


async def _gateways_up(sched: SchedulerDaemon) -> None:
    await sched.wait_for(lambda: all(g["connected"] for g in sched.status()["gateways"].values()))


async def test_a_trainer_killed_mid_epoch_and_restarted_loses_no_shard() -> None:
    with short_dir() as tmp:
        configs = site_configs(tmp, "ab", scheduler=f"unix://{tmp}/sched.sock")
        async with running(configs) as cluster, scheduler(_sched_cfg(tmp)) as sched:
            async with asyncio.timeout(90):
                await _gateways_up(sched)
                url = {s: c.trainer_listen for s, c in configs.items()}
                a = await Trainer.start(url["a"], "a", "--hang-after", "3")
                b = await Trainer.start(url["b"], "b", "--step-s", "0.02")
                await a.read_steps(3)  # 12 samples: one shard reported, the next half consumed
                svc = sched.node.shards
                await a.kill()
                await sched.wait_for(lambda: not svc.held_by("a", 0))  # the gateway said it left
                assert svc.stats.released >= 1
                a2 = await Trainer.start(url["a"], "a", "--step-s", "0.02")
                await asyncio.gather(a2.read_steps(), b.read_steps())
            assert svc.complete and svc.lost() == 0
            seen = _check_coverage(a, a2, b)
            twice = {i for i, c in seen.items() if c > 1}
            assert all(c <= 2 for c in seen.values())
            assert twice and {i // SHARD for i in twice} <= {i // SHARD for i in a.samples()}
            # every shard the killed rank held was trained again by someone, and counted as a repeat
            assert svc.stats.repeated == svc.stats.released
            assert a2.finished is not None and b.finished is not None
            assert b.finished["granted"] > 0
            await cluster.stop_all()


async def test_a_restarted_scheduler_keeps_the_shards_already_done(tmp_path: Path) -> None:
    state = tmp_path / "shards.json"
    with short_dir() as tmp:
        cfg = _sched_cfg(tmp, state_file=str(state), snapshot_interval_s=0.1)
        configs = site_configs(tmp, "a", scheduler=f"unix://{tmp}/sched.sock")
        url = configs["a"].trainer_listen
        async with running(configs) as cluster:
            async with asyncio.timeout(90):
                async with scheduler(cfg) as sched:
                    await sched.wait_for(lambda: sched.status()["gateways"]["a"]["connected"])
                    a = await Trainer.start(url, "a", "--hang-after", "6")
                    await a.read_steps(6)
                    await sched.wait_for(lambda: sched.node.shards.counts()["done"] >= 2)
                    before = sched.node.shards.counts()
                    done_before = {
                        sid for sid in range(N // SHARD) if sched.node.shards.state_of(0, sid) == 2
                    }
                assert json.loads(state.read_text())["epochs"][0]["states"].count("X") == before["done"]
                async with scheduler(cfg) as again:
                    svc = again.node.shards
                    assert svc.counts()["done"] == before["done"]  # progress survived the restart
                    assert svc.lost() == 0
                    await a.kill()
                    a2 = await Trainer.start(url, "a")
                    await a2.read_steps()
                    assert svc.complete and svc.lost() == 0
            seen = _check_coverage(a, a2)
            again_trained = {i // SHARD for i in a2.samples()}
            assert again_trained.isdisjoint(done_before)  # DONE shards are never handed out again
            assert all(c <= 2 for c in seen.values())
            assert svc.stats.repeated <= cfg.sharding.max_outstanding
            await cluster.stop_all()


async def test_two_sites_train_every_sample_once_per_epoch_across_epoch_boundaries() -> None:
    with short_dir() as tmp:
        configs = site_configs(tmp, "ab", scheduler=f"unix://{tmp}/sched.sock")
        async with running(configs) as cluster, scheduler(_sched_cfg(tmp, epochs=3)) as sched:
            async with asyncio.timeout(90):
                await _gateways_up(sched)
                url = {s: c.trainer_listen for s, c in configs.items()}
                a = await Trainer.start(url["a"], "a", "--step-s", "0.01", "--epochs", "3")
                b = await Trainer.start(url["b"], "b", "--step-s", "0.02", "--epochs", "3")
                await asyncio.gather(a.read_steps(), b.read_steps())
                svc = sched.node.shards
                # the trainers' last reports may still be on their way through the gateways
                await sched.wait_for(lambda: svc.stats.epochs_completed == 3)
            assert svc.complete and svc.stats.repeated == 0
            seen = Counter(i for t in (a, b) for i in t.samples())
            assert set(seen) == set(range(N)) and set(seen.values()) == {3}  # once per epoch, no repeat
            await cluster.stop_all()
