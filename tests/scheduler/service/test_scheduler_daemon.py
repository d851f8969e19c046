"""The scheduler daemon with real gateway daemons and trainers: one job-wide effective iteration; the job
keeps training while the scheduler is down and a restarted scheduler resumes from what gateways run."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from pathlib import Path

import aiohttp

from scheduler.daemon_config import SchedulerDaemonConfig
from scheduler.service.daemon import serving as scheduler
from tools.harness.daemon_cluster import (
    JOB,
    SECRET,
    TEST_TIMEOUTS,
    running,
    short_dir,
    site_configs,
    trainers_for,
)

TOKEN = "control-token-0123456789abcdef"


def _sched_cfg(d: Path, **kw: object) -> SchedulerDaemonConfig:
    token = d / "token"
    token.write_text(TOKEN + "\n")
    return SchedulerDaemonConfig(
        job=JOB,
        sites=("a", "b"),
        secret=SECRET,
        listen=f"unix://{d}/sched.sock",
        metrics_port=0,
        control_token_file=str(token),
        decide_interval_s=0.2,
        reply_timeout_s=5.0,
        announce_margin=6,
        timeouts=TEST_TIMEOUTS,
        **kw,  # type: ignore[arg-type]
    )


async def test_a_change_reaches_every_site_for_the_same_iteration() -> None:
    with short_dir() as tmp:
        scfg = _sched_cfg(tmp)
        configs = site_configs(tmp, "ab", scheduler=f"unix://{tmp}/sched.sock", telemetry_interval_s=0.2)
        async with running(configs) as cluster, scheduler(scfg) as sched:
            trainers = trainers_for(cluster, layers=2, iterations=30)
            for t in trainers.values():
                await t.connect()
            runs = [asyncio.create_task(t.run()) for t in trainers.values()]
            async with asyncio.timeout(60):
                await sched.wait_for(lambda: all(g["connected"] for g in sched.status()["gateways"].values()))
                out = sched.request({"density": 0.05, "staleness": 0})
                assert out["state"] == "preparing"
                await sched.wait_for(lambda: sched.node.current is not None)
                for t in trainers.values():
                    await t.wait(lambda t=t: bool(t.configs))  # type: ignore[misc]
                await asyncio.gather(*runs)
            committed = sched.node.current
            assert committed is not None and committed.id >= out["decision"]  # may have been re-prepared
            updates = {s: t.configs[-1] for s, t in trainers.items()}
            assert {u.effective_iteration for u in updates.values()} == {committed.effective_iteration}
            assert all(u.values == {"density": 0.05, "staleness": 0} for u in updates.values())
            for t in trainers.values():
                await t.close()
            await cluster.stop_all()


async def test_training_goes_on_without_the_scheduler_and_a_new_one_resumes() -> None:
    with short_dir() as tmp:
        scfg = _sched_cfg(tmp)
        configs = site_configs(tmp, "ab", scheduler=f"unix://{tmp}/sched.sock", telemetry_interval_s=0.2)
        async with running(configs) as cluster:
            trainers = trainers_for(cluster, layers=2, iterations=40)
            for t in trainers.values():
                await t.connect()
            async with scheduler(scfg) as sched:
                await sched.wait_for(lambda: all(g["connected"] for g in sched.status()["gateways"].values()))
                sched.request({"density": 0.1})
                await sched.wait_for(lambda: sched.node.current is not None)
                decision = sched.node.current
                assert decision is not None
            runs = [asyncio.create_task(t.run()) for t in trainers.values()]
            async with asyncio.timeout(60):
                await asyncio.gather(*runs)  # no scheduler now: every round still completes
                for t in trainers.values():
                    await t.wait_all(40)
            async with scheduler(scfg) as again:
                async with asyncio.timeout(30):
                    await again.wait_for(lambda: again.node.current is not None)
                cur = again.node.current
                assert cur is not None and cur.id == decision.id and cur.values == {"density": 0.1}
                assert again.node._next_id == decision.id + 1
            for t in trainers.values():
                await t.close()
            await cluster.stop_all()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_http_config_needs_the_token_json_and_sane_values() -> None:
    with short_dir() as tmp:
        cfg = dataclasses.replace(_sched_cfg(tmp), metrics_port=_free_port())
        async with scheduler(cfg) as sched, aiohttp.ClientSession() as http:
            base = sched.ready_info()["metrics_url"]
            url = f"{base}/config"
            good = {"Authorization": f"Bearer {TOKEN}"}
            async with http.post(url, json={"values": {"density": 0.1}}) as r:
                assert r.status == 401
            plain = {**good, "Content-Type": "text/plain"}
            async with http.post(url, data='{"values": {"density": 0.1}}', headers=plain) as r:
                assert r.status == 415  # a cross-origin form post cannot send JSON
            async with http.post(url, json={"values": {"staleness": 1000}}, headers=good) as r:
                assert r.status == 400 and "staleness" in (await r.json())["error"]
            nested = "[" * 5000 + "]" * 5000
            as_json = {**good, "Content-Type": "application/json"}
            async with http.post(url, data=nested, headers=as_json) as r:
                assert r.status == 400 and "nested" in (await r.json())["error"]
            async with http.post(url, json={"values": {"density": 0.1}}, headers=good) as r:
                assert r.status == 200 and (await r.json())["values"] == {"density": 0.1}
            async with http.get(f"{base}/status") as r:
                status = await r.json()
                assert status["job"] == JOB
                assert status["control"] == {"mode": "manual", "held": {"density": 0.1}}  # held, and said
            async with http.post(url, json={"release": ["staleness"]}, headers=good) as r:
                assert r.status == 400 and "not held" in (await r.json())["error"]
            async with http.post(url, json={"release": True}, headers=good) as r:
                assert r.status == 200 and (await r.json())["released"] == ["density"]
            async with http.get(f"{base}/status") as r:
                assert (await r.json())["control"]["held"] == {}
