"""Per-site keys (reliability item 9): one leaked key is not every key. A trainer's key cannot act as a
gateway or as another site's trainer, and a site cannot act as another site towards a third; the job
itself runs as with one shared secret."""

from __future__ import annotations

import asyncio
import dataclasses
import os

import pytest

from gateways.rounds.config import RoundConfig
from tests.gateways.service.daemon_fakes import FakePeer
from tools.harness.daemon_cluster import JOB, running, short_dir, site_configs
from tools.harness.daemon_trainer import FakeTrainer
from wanrt.errors import AuthError
from wanrt.keys import site_keys, write_keys_file

ROUNDS = RoundConfig(topology="star", round_deadline_s=20.0, suspect_after_s=20.0)


@pytest.fixture(autouse=True)
def _numpy_codec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANRT_KERNELS", "numpy")


@pytest.mark.timeout(60)
async def test_each_key_proves_only_its_own_place() -> None:
    per_site, _ = site_keys(os.urandom(32), JOB, "abc")
    with short_dir() as tmp:
        configs = site_configs(tmp, "abc", rounds=ROUNDS)
        for s, cfg in configs.items():
            path = write_keys_file(tmp / f"{s}.keys", per_site[s])
            configs[s] = dataclasses.replace(cfg, secret=None, keys_file=str(path))
        async with running(configs) as cluster:
            trainers = {
                s: FakeTrainer(
                    cfg.trainer_listen, s, JOB, per_site[s]["trainer"].encode(), layers=2, iterations=3
                )
                for s, cfg in configs.items()
            }
            for t in trainers.values():
                await t.connect()
            runs = [asyncio.create_task(t.run()) for t in trainers.values()]
            for t in trainers.values():
                await t.wait_all(3)  # the job runs with per-site keys
            await asyncio.gather(*runs)
            assert all(not t.errors for t in trainers.values())

            b_listen = configs["b"].listen
            # site a's trainer key, presented by a "gateway a" to b
            error, _ = await FakePeer("a", JOB, per_site["a"]["trainer"].encode(), ROUNDS).wrong_secret(
                b_listen, forge_auth=False
            )
            assert "proof" in error or "secret" in error, error
            # site c holds the key of the pair {b, c}; with it, it cannot act as a towards b
            error, _ = await FakePeer("a", JOB, per_site["c"]["peers"]["b"].encode(), ROUNDS).wrong_secret(
                b_listen, forge_auth=True
            )
            assert error
            # site a's trainer key at site b's trainer socket
            key_a = per_site["a"]["trainer"].encode()
            stranger = FakeTrainer(configs["b"].trainer_listen, "b", JOB, key_a, layers=2, iterations=1)
            with pytest.raises(AuthError):
                await stranger.connect()
            # and the real link a—b is still the one in use
            assert cluster.daemons["b"].status()["peers"]["a"]["state"] == "up"
            for t in trainers.values():
                await t.close()
            await cluster.stop_all()
