"""The real client streams a dense layer to real gateways (all-pairs, cut-through): slices leave before the
push is whole, and every site gets the same result as from whole pushes."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gateways.rounds.config import RoundConfig
from tools.harness.daemon_cluster import JOB, SECRET, running, short_dir, site_configs
from wanrt.payload import SparsePayload

DENSE = 16 * 600 - 5
CHUNK = 4096  # 4 pieces per 200-block segment


@pytest.fixture(autouse=True)
def _numpy_codec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANRT_KERNELS", "numpy")


def _push(i: int, it: int) -> SparsePayload:
    dense = np.random.default_rng(10 * it + i).standard_normal(DENSE).astype(np.float32)
    return SparsePayload.from_dense_blocks(0, dense, np.arange(-(-DENSE // 16)), 16)


@pytest.mark.timeout(90)
async def test_the_client_streams_dense_pushes_and_every_site_gets_the_same_sum() -> None:
    from wanrt.client.config import ClientConfig
    from wanrt.client.link.api import LinkSpec, UpdateArrived
    from wanrt.client.link.gateway_link import open_gateway_link
    from wanrt.client.link.signature import LayerSignature

    rounds = RoundConfig(
        topology="allpairs", allpairs_chunk_bytes=CHUNK, round_deadline_s=20.0, suspect_after_s=20.0
    )
    sig = LayerSignature.of(["w"], [(DENSE,)], ["float32"])
    with short_dir() as tmp:
        configs = site_configs(tmp, "abc", rounds=rounds)
        async with running(configs) as cluster:
            links = {}
            for s in "abc":
                spec = LinkSpec(configs[s].trainer_listen, s, JOB, SECRET.encode(), sig, ClientConfig())
                links[s] = await asyncio.to_thread(open_gateway_link, spec)
            try:
                for it in range(3):
                    for i, s in enumerate("abc"):
                        links[s].push(it, 0, _push(i, it))
                    got = {s: await asyncio.to_thread(links[s].get, 20.0) for s in "abc"}
                    assert all(isinstance(ev, UpdateArrived) for ev in got.values())
                    vals = {
                        s: (ev.payload.indices.tobytes(), ev.payload.values.tobytes())
                        for s, ev in got.items()
                        if isinstance(ev, UpdateArrived)
                    }
                    assert len(set(vals.values())) == 1  # the same bits everywhere
                    ev = got["a"]
                    assert isinstance(ev, UpdateArrived) and ev.sites == ("a", "b", "c")
                    exact = sum(_push(i, it).to_dense().astype(np.float64) for i in range(3))
                    np.testing.assert_allclose(ev.payload.to_dense(), exact, rtol=1e-5, atol=1e-5)
                for s in "abc":
                    engine = cluster.daemons[s].node.engine
                    assert engine is not None and engine.stats.streamed_slices == 3 * 2 * 4
                    assert cluster.daemons[s].node.stats.trainer_pushes == 3  # each push counted once
            finally:
                for link in links.values():
                    await asyncio.to_thread(link.close, 5.0)
            await cluster.stop_all()
