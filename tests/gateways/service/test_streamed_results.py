"""Real gateways stream a dense result to the real client link piece by piece (all-pairs, cut-through,
``stream_results``): every site puts together the same bits as a whole result would bring."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gateways.rounds.config import RoundConfig
from tools.harness.daemon_cluster import JOB, SECRET, running, short_dir, site_configs
from wanrt.payload import SparsePayload

DENSE = 16 * 600 - 5
CHUNK = 4096  # 4 pieces per 200-block segment
ROUNDS = 3


@pytest.fixture(autouse=True)
def _numpy_codec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANRT_KERNELS", "numpy")


def _push(i: int, it: int) -> SparsePayload:
    dense = np.random.default_rng(10 * it + i).standard_normal(DENSE).astype(np.float32)
    p = SparsePayload.from_dense_blocks(0, dense, np.arange(-(-DENSE // 16)), 16)
    return SparsePayload(0, DENSE, 16, p.indices, p.values.astype(np.float16), "fp16")


async def _results(stream: bool) -> tuple[list[bytes], dict[str, int]]:
    """The results of ROUNDS rounds (their bits, the same at every site) and each link's streamed count."""
    from wanrt.client.config import ClientConfig
    from wanrt.client.link.api import LinkSpec, UpdateArrived
    from wanrt.client.link.gateway_link import open_gateway_link
    from wanrt.client.link.signature import LayerSignature

    rounds = RoundConfig(
        topology="allpairs",
        allpairs_chunk_bytes=CHUNK,
        stream_results=stream,
        round_deadline_s=20.0,
        suspect_after_s=20.0,
    )
    sig = LayerSignature.of(["w"], [(DENSE,)], ["float32"])
    out: list[bytes] = []
    with short_dir() as tmp:
        configs = site_configs(tmp, "abc", rounds=rounds)
        async with running(configs) as cluster:
            links = {}
            for s in "abc":
                spec = LinkSpec(
                    configs[s].trainer_listen, s, JOB, SECRET.encode(), sig, ClientConfig(wire_dtype="fp16")
                )
                links[s] = await asyncio.to_thread(open_gateway_link, spec)
            try:
                for it in range(ROUNDS):
                    for i, s in enumerate("abc"):
                        links[s].push(it, 0, _push(i, it))
                    got = {s: await asyncio.to_thread(links[s].get, 20.0) for s in "abc"}
                    bits = set()
                    for ev in got.values():
                        assert isinstance(ev, UpdateArrived) and ev.sites == ("a", "b", "c")
                        p = ev.payload
                        assert p.dense_len == DENSE and p.value_dtype == "fp16"
                        bits.add(p.indices.tobytes() + p.values.tobytes())
                    assert len(bits) == 1  # the same bits everywhere
                    out.append(bits.pop())
                    ev = got["a"]
                    assert isinstance(ev, UpdateArrived)
                    exact = sum(_push(i, it).to_dense().astype(np.float64) for i in range(3))
                    np.testing.assert_allclose(ev.payload.to_dense(), exact, rtol=3e-3, atol=3e-3)
                streamed = {s: links[s].results_streamed for s in "abc"}  # type: ignore[attr-defined]
                for s in "abc":
                    assert cluster.daemons[s].node.stats.aggregates_delivered == ROUNDS
            finally:
                for link in links.values():
                    await asyncio.to_thread(link.close, 5.0)
            await cluster.stop_all()
    return out, streamed


@pytest.mark.timeout(120)
async def test_a_streamed_result_is_the_whole_results_bits_at_every_site() -> None:
    streamed_bits, streamed = await _results(stream=True)
    assert streamed == dict.fromkeys("abc", ROUNDS)  # every result came in pieces
    whole_bits, whole = await _results(stream=False)
    assert whole == dict.fromkeys("abc", 0)
    assert streamed_bits == whole_bits
