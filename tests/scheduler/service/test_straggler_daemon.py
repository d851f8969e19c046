"""End to end on real daemons: a site whose trainer reports a persistently longer batch time makes the
scheduler daemon (``policy = "stragglers"``) announce a smaller batch for it, and every site's trainer gets
the change for the same iteration."""

from __future__ import annotations

import asyncio
import contextlib

from scheduler.daemon_config import SchedulerDaemonConfig
from scheduler.service.daemon import SchedulerDaemon
from scheduler.service.policies import make_policy
from scheduler.stragglers.config import BatchConfig, DetectionConfig
from scheduler.stragglers.site_config import SiteStragglerConfig
from tools.harness.daemon_cluster import (
    JOB,
    SECRET,
    TEST_TIMEOUTS,
    running,
    short_dir,
    site_configs,
    trainers_for,
)
from tools.harness.daemon_trainer import FakeTrainer
from wanrt.protocol import Telemetry

#: per-iteration compute each site's leader reports: c is three times slower per sample
COMPUTE_S = {"a": 0.1, "b": 0.1, "c": 0.3}
BATCH = 32


async def report_while_training(trainer: FakeTrainer, stop: asyncio.Event) -> None:
    """What a site leader's StepTimer sends after each iteration (wanrt.client.leader.step_timing)."""
    sent = -1
    while not stop.is_set():
        await trainer.wait(
            lambda last=sent: trainer.next_it > last + 1 or stop.is_set() or bool(trainer.errors)  # type: ignore[misc]
        )
        if stop.is_set() or trainer.errors:
            return
        sent = trainer.next_it - 1
        c = COMPUTE_S[trainer.site]
        metrics = {"iteration_s": c, "compute_s": c, "idle_s": 0.0, "batch_size": float(BATCH)}
        await trainer._send(Telemetry(trainer.site, sent, {**metrics, "world_size": 1.0}))


async def test_a_persistent_straggler_site_gets_a_smaller_batch_from_the_running_daemon() -> None:
    with short_dir() as tmp:
        stragglers = SiteStragglerConfig(
            # min_coverage 0: the first reports already count for the long window, so the test does not
            # wait out a window in real time; the two-window logic itself is unit-tested
            detection=DetectionConfig(slowness=1.5, short_s=5.0, long_s=10.0, min_coverage=0.0),
            batch=BatchConfig(rebalance_gain=0.1),
        )
        cfg = SchedulerDaemonConfig(
            job=JOB,
            sites=("a", "b", "c"),
            secret=SECRET,
            listen=f"unix://{tmp}/sched.sock",
            policy="stragglers",
            stragglers=stragglers,
            decide_interval_s=0.2,
            reply_timeout_s=5.0,
            announce_margin=6,
            timeouts=TEST_TIMEOUTS,
        )
        configs = site_configs(tmp, "abc", scheduler=f"unix://{tmp}/sched.sock", telemetry_interval_s=0.1)
        sched = SchedulerDaemon(cfg, policy=make_policy(cfg))
        sched_task = asyncio.create_task(sched.run())
        stop = asyncio.Event()
        try:
            await sched.wait_for(lambda: sched._listener is not None)
            async with running(configs) as cluster:
                trainers = trainers_for(cluster, layers=1, iterations=100_000)
                for t in trainers.values():
                    await t.connect()
                tasks = [asyncio.create_task(t.run()) for t in trainers.values()]
                tasks += [asyncio.create_task(report_while_training(t, stop)) for t in trainers.values()]
                try:
                    async with asyncio.timeout(60):
                        await sched.wait_for(
                            lambda: (
                                sched.node.current is not None and "batch_size@c" in sched.node.current.values
                            )
                        )
                        for t in trainers.values():
                            await t.wait(lambda t=t: any("batch_size" in u.values for u in t.configs))  # type: ignore[misc]
                finally:
                    stop.set()
                    for task in tasks:
                        task.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)
                    for t in trainers.values():
                        with contextlib.suppress(Exception):
                            await t.close()
        finally:
            sched.request_stop()
            await asyncio.wait_for(sched_task, 20)
    decision = sched.node.current
    assert decision is not None
    updates = {s: next(u for u in t.configs if "batch_size" in u.values) for s, t in trainers.items()}
    assert {u.effective_iteration for u in updates.values()} == {decision.effective_iteration}
    batch = {s: u.values["batch_size"] for s, u in updates.items()}
    assert batch["c"] < BATCH < min(batch["a"], batch["b"]) and abs(batch["a"] - batch["b"]) <= 1
    assert sum(batch.values()) == 3 * BATCH  # Eq. 3 keeps the global batch
    weights = {s: u.values["batch_weight"] for s, u in updates.items()}
    assert abs(sum(weights.values()) - 3.0) < 1e-9  # the cross-site average weights by samples
