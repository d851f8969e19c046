"""The public client (``wanrt.init`` + ``SparseOptimizer``, torch) on real gateways that stream each dense
result to it piece by piece (all-pairs cut-through, ``stream_results``): every site ends with the very
parameters it gets from whole results."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from gateways.rounds.config import RoundConfig
from tools.harness.daemon_cluster import JOB, SECRET, running, short_dir, site_configs

ELEMENTS = 16 * 600 - 5
CHUNK = 4096  # 4 pieces per 200-block segment
STEPS = 3
SITES = "abc"


@pytest.fixture(autouse=True)
def _numpy_codec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANRT_KERNELS", "numpy")


def _train(url: str, site: str) -> tuple[bytes, int]:
    """One site's trainer, as a user writes it: the parameters' bits after STEPS steps, and how many of
    its results came in pieces."""
    import wanrt
    from wanrt.client import ClientConfig, SparseOptimizer

    cfg = ClientConfig(
        density=1.0, wire_dtype="fp16", staleness=0, error_feedback=False, update_deadline_s=30.0
    )
    ctx = wanrt.init(url, site=site, job=JOB, secret=SECRET.encode(), config=cfg)
    try:
        w = torch.nn.Parameter(torch.zeros(ELEMENTS, dtype=torch.float32))
        opt = SparseOptimizer([("w", w)], "sgd", lr=0.1, ctx=ctx)
        g = torch.from_numpy(np.random.default_rng(ord(site)).standard_normal(ELEMENTS).astype(np.float32))
        for _ in range(STEPS):
            torch.dot(w, g).backward()
            opt.step()
            opt.zero_grad()
        streamed = ctx._link.results_streamed  # type: ignore[union-attr]
        return w.detach().numpy().tobytes(), streamed
    finally:
        ctx.close()


async def _run(stream: bool) -> dict[str, tuple[bytes, int]]:
    rounds = RoundConfig(
        topology="allpairs",
        allpairs_chunk_bytes=CHUNK,
        stream_results=stream,
        round_deadline_s=20.0,
        suspect_after_s=20.0,
    )
    with short_dir() as tmp:
        configs = site_configs(tmp, SITES, rounds=rounds)
        async with running(configs) as cluster:
            loop = asyncio.get_running_loop()
            with ThreadPoolExecutor(len(SITES)) as pool:
                futs = {s: loop.run_in_executor(pool, _train, configs[s].trainer_listen, s) for s in SITES}
                out = {s: await f for s, f in futs.items()}
            await cluster.stop_all()
    return out


@pytest.mark.timeout(120)
async def test_training_on_streamed_results_ends_with_the_parameters_of_whole_results(
    single_rank_group: None,
) -> None:
    streamed = await _run(stream=True)
    assert {s: n for s, (_, n) in streamed.items()} == dict.fromkeys(SITES, STEPS)  # all came in pieces
    whole = await _run(stream=False)
    assert {s: n for s, (_, n) in whole.items()} == dict.fromkeys(SITES, 0)
    params = {bits for bits, _ in streamed.values()} | {bits for bits, _ in whole.values()}
    assert len(params) == 1  # every site, either way: the same parameters, bit for bit
    w = np.frombuffer(params.pop(), dtype=np.float32)
    assert np.abs(w).max() > 0  # the steps moved them
