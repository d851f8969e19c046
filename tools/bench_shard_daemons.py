"""The real-daemon part of ``tools/bench_stragglers.py`` [5]: data shards through a scheduler daemon, two
gateway daemons and trainer processes, with crashes.

One epoch of ``samples`` samples in shards of 20, two sites, one trainer process each (the real client
link and :class:`~wanrt.client.shard_sampler.ShardSampler`, tools/shard_trainer.py). Mid-epoch both
trainers stop answering while holding shards; the scheduler is restarted (its shard table survives in its
state file); then both trainers are SIGKILLed and started again. ``lost`` = shards of which some sample
was never trained by any trainer (from the trainers' own step records), ``repeated`` = the scheduler's
count of shards DONE after being handed out more than once, ``samples_twice`` = samples trained twice.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from shard_trainer import TrainerProcess

from gateways.config import GatewayConfig
from gateways.service.daemon import GatewayDaemon
from scheduler.daemon_config import SchedulerDaemonConfig
from scheduler.service.daemon import serving as _scheduler
from scheduler.sharding import ShardingConfig
from transports import Timeouts
from transports.urls import short_socket_dir

ROOT = Path(__file__).resolve().parents[1]
JOB, SECRET = "testjob", "s3cret-s3cret-s3cret"  # what tools/shard_trainer.py presents
SHARD, BATCH = 20, 8
TIMEOUTS = Timeouts(connect=5.0, handshake=5.0, send=30.0, close=2.0, heartbeat_interval=0.5)


async def _run(samples: int, d: Path) -> dict[str, Any]:
    sched_url = f"unix://{d}/sched.sock"
    scfg = SchedulerDaemonConfig(
        job=JOB,
        sites=("a", "b"),
        secret=SECRET,
        listen=sched_url,
        policy="fixed",
        timeouts=TIMEOUTS,
        sharding=ShardingConfig(
            shard_size=SHARD,
            epochs=1,
            lease_s=60.0,
            max_outstanding=2,
            state_file=str(d / "shards.json"),
            snapshot_interval_s=0.2,
        ),
    )
    gws: dict[str, GatewayDaemon] = {}
    tasks: list[asyncio.Task[Any]] = []
    for s, p in (("a", "b"), ("b", "a")):
        cfg = GatewayConfig(
            site=s,
            job=JOB,
            secret=SECRET,
            listen=f"unix://{d}/g{s}.sock",
            trainer_listen=f"unix://{d}/t{s}.sock",
            peers={p: f"unix://{d}/g{p}.sock"},
            scheduler=sched_url,
            reconnect_initial_s=0.05,
            reconnect_max_s=0.2,
            timeouts=TIMEOUTS,
        )
        gws[s] = GatewayDaemon(cfg)
        ready = asyncio.Event()
        tasks.append(asyncio.create_task(gws[s].run(on_ready=ready.set)))
        await ready.wait()
    url = {s: f"unix://{d}/t{s}.sock" for s in gws}
    steps = samples // BATCH // 6 + 1  # each trainer hangs a sixth into the epoch, inside a shard
    try:
        async with asyncio.timeout(120):
            async with _scheduler(scfg) as sched:
                await sched.wait_for(lambda: all(g["connected"] for g in sched.status()["gateways"].values()))
                a = await TrainerProcess.start(url["a"], "a", samples, BATCH, "--hang-after", str(steps))
                b = await TrainerProcess.start(
                    url["b"], "b", samples, BATCH, "--hang-after", str(steps), "--step-s", "0.005"
                )
                await asyncio.gather(a.read_steps(steps), b.read_steps(steps))
            async with _scheduler(scfg) as again:  # a restarted scheduler, from the state file
                restored = again.node.shards.counts()
                await a.kill()
                await b.kill()
                a2 = await TrainerProcess.start(url["a"], "a", samples, BATCH)
                b2 = await TrainerProcess.start(url["b"], "b", samples, BATCH, "--step-s", "0.005")
                await asyncio.gather(a2.read_steps(), b2.read_steps())
                svc = again.node.shards
                complete, service_lost = svc.complete, svc.lost()
                repeated = svc.stats.repeated
    finally:
        for g in gws.values():
            g.request_stop()
        await asyncio.gather(*tasks, return_exceptions=True)
    seen = Counter(i for t in (a, b, a2, b2) for i in t.samples())
    missing = {i // SHARD for i in range(samples) if i not in seen}
    return {
        "lost": len(missing) + (0 if complete else 1) + service_lost,
        "repeated": repeated,
        "samples_twice": sum(1 for c in seen.values() if c > 1),
        "restored_done": restored["done"],
        "shards": -(-samples // SHARD),
    }


def measure(quick: bool) -> dict[str, Any]:
    """Run the scenario once (``quick``: 1 200 samples, else 6 000)."""
    samples = 1200 if quick else 6000
    logging.disable(logging.WARNING)  # the daemons log every link going down: expected here
    try:
        with short_socket_dir("ws") as d:
            return asyncio.run(_run(samples, d))
    finally:
        logging.disable(logging.NOTSET)


if __name__ == "__main__":
    print(measure("--quick" in sys.argv))
