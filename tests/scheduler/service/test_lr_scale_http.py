"""``POST /config`` of the job's ``lr_scale`` at the scheduler daemon's HTTP endpoint: accepted as a manual
request like the other trainer keys, and a value out of (0, 64] or a per-site ``lr_scale@<site>`` answered
400 with an error that names it."""

from __future__ import annotations

import dataclasses

import aiohttp

from scheduler.service.daemon import serving as scheduler
from tests.scheduler.service.test_scheduler_daemon import TOKEN, _free_port, _sched_cfg
from tools.harness.daemon_cluster import short_dir


async def test_http_config_takes_a_job_wide_scale_and_refuses_bad_ones() -> None:
    with short_dir() as tmp:
        cfg = dataclasses.replace(_sched_cfg(tmp), metrics_port=_free_port())
        async with scheduler(cfg) as sched, aiohttp.ClientSession() as http:
            url = f"{sched.ready_info()['metrics_url']}/config"
            good = {"Authorization": f"Bearer {TOKEN}"}
            for bad, named in (({"lr_scale": 0}, "lr_scale"), ({"lr_scale": 1000}, "lr_scale")):
                async with http.post(url, json={"values": bad}, headers=good) as r:
                    assert r.status == 400 and named in (await r.json())["error"]
            async with http.post(url, json={"values": {"lr_scale@a": 2.0}}, headers=good) as r:
                error = (await r.json())["error"]
                assert r.status == 400 and "lr_scale@a" in error and "whole job" in error
            async with http.post(url, json={"values": {"lr_scale": 2.0}}, headers=good) as r:
                assert r.status == 200 and (await r.json())["values"] == {"lr_scale": 2.0}
