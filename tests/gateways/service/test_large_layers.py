"""Layers far larger than a chunk: payloads cut into protocol Chunks, interleaved by the EDF queue across
layers and reassembled on the other side, over emulated WAN links; sums still exact in star and ring."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import zlib

import numpy as np
import pytest

from gateways.config import EdfConfig, PeerShape
from gateways.rounds.config import RoundConfig
from tools.harness.daemon_cluster import running, short_dir, site_configs, trainers_for
from wanrt.payload import SparsePayload, n_blocks

DENSE_LEN = 30_000  # ~37 KB of fp32 values per payload at 30 % of the blocks: several 8 KiB chunks
BLOCK = 16


@functools.lru_cache(maxsize=256)
def _big(site: str, iteration: int, layer: int) -> SparsePayload:
    rng = np.random.default_rng(zlib.crc32(f"{site}/{iteration}/{layer}".encode()))
    nb = n_blocks(DENSE_LEN, BLOCK)
    idx = np.flatnonzero(rng.random(nb) < 0.3).astype(np.int64)
    dense = rng.integers(-4, 5, size=DENSE_LEN).astype(np.float32)
    return SparsePayload.from_dense_blocks(layer, dense, idx, BLOCK)


@pytest.fixture(autouse=True)
def _numpy_codec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANRT_KERNELS", "numpy")


@pytest.mark.parametrize(
    "kind,edf",
    [
        ("star", EdfConfig(chunk_bytes=8192, coalesce_bytes=1024)),  # each payload in several chunks
        ("ring", EdfConfig(chunk_bytes=8192, coalesce_bytes=1024)),
        ("star", EdfConfig()),  # one 256 KiB chunk holds a payload, but not coalesced with its tag
    ],
)
@pytest.mark.timeout(90)
async def test_chunked_payloads_sum_exactly(kind: str, edf: EdfConfig) -> None:
    rounds = RoundConfig(topology=kind, round_deadline_s=20.0, suspect_after_s=20.0)  # type: ignore[arg-type]
    with short_dir() as tmp:
        configs = site_configs(tmp, "abc", rounds=rounds, edf=edf)
        for s, cfg in configs.items():  # every link emulated: 200 Mbit/s, 2 ms one way
            shaping = {p: PeerShape(200e6, delay_s=0.002) for p in cfg.peers}
            configs[s] = dataclasses.replace(cfg, shaping=shaping)
        async with running(configs) as cluster:
            trainers = trainers_for(cluster, layers=3, iterations=6, payload=_big)
            for t in trainers.values():
                await t.connect()
            async with asyncio.timeout(60):
                await asyncio.gather(*(t.run() for t in trainers.values()))
                for t in trainers.values():
                    await t.wait_all(6)
            for (it, layer), agg in trainers["a"].aggregates.items():
                assert agg.sites == ("a", "b", "c")
                expect = np.zeros(DENSE_LEN, np.float32)
                for t in trainers.values():
                    t.pushed[(it, layer)].add_into(expect)
                np.testing.assert_array_equal(agg.payload.to_dense(), expect)
                for t in trainers.values():
                    assert (
                        t.aggregates[(it, layer)].payload.values_f32().tobytes()
                        == agg.payload.values_f32().tobytes()
                    )
            for s in "abc":
                st = cluster.daemons[s].status()
                assert st["counters"]["peers_lost"] == 0, st["peers"]
                assert all(p["connects"] == 1 for p in st["peers"].values())
            for t in trainers.values():
                await t.close()
            await cluster.stop_all()
