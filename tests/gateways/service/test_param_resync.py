"""Parameter resync with real gateway daemons: a gateway restarted from a state file behind the job tells its
trainer, which fetches the job's parameters from a running site over the gateway links and ends the run
with exactly the parameters of every other site (the chaos soak's ``ranks_identical_at_end``)."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest

from gateways.rounds.config import RoundConfig
from tools.harness.daemon_cluster import running, short_dir, site_configs, trainers_for

ITERATIONS = 40
LAYERS = 3
K = 8  # the iteration c's gateway dies at


@pytest.fixture(autouse=True)
def _numpy_codec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANRT_KERNELS", "numpy")


@pytest.mark.timeout(180)
async def test_a_restarted_gateway_s_trainer_fetches_the_parameters_and_ends_identical() -> None:
    rounds = RoundConfig(topology="star", round_deadline_s=5.0, suspect_after_s=5.0)
    with short_dir() as tmp:
        configs = site_configs(tmp, "abc", rounds=rounds)
        for s, cfg in configs.items():
            configs[s] = dataclasses.replace(cfg, state_file=str(tmp / f"state-{s}.json"))
        async with running(configs) as cluster:
            trainers = trainers_for(cluster, layers=LAYERS, iterations=ITERATIONS)
            for t in trainers.values():
                await t.connect()
            runs = [asyncio.create_task(t.run()) for t in trainers.values()]
            a, c = trainers["a"], trainers["c"]
            async with asyncio.timeout(150):
                await c.wait(lambda: (K, 0) in c.aggregates)
                await cluster.kill("c")
                await a.wait(lambda: (K + 10, LAYERS - 1) in a.aggregates)  # the job ran on without c
                new_c = await cluster.start("c")
                await new_c.wait_joined()
                await c.reconnect()
                await asyncio.gather(*runs)
                for t in trainers.values():
                    await t.wait_all(ITERATIONS)
                await c.wait(lambda: not c.state.receiver.holding)
            for t in trainers.values():
                await t.close()
            await cluster.stop_all()

        join_at = c.welcome.info["join_at"] if c.welcome is not None else -1
        assert isinstance(join_at, int) and join_at > K + 10
        # c missed the rounds it was down for ...
        assert any((it, 0) not in c.aggregates for it in range(K + 1, join_at))
        # ... was told, asked once, and got a snapshot served by a or b
        assert [n.info["iteration"] for n in c.notices if n.kind == "resync"] == [join_at]
        assert c.state.resyncs == 1 and c.state.snapshot is not None
        assert c.state.snapshot.iteration >= join_at
        assert trainers["a"].state.served + trainers["b"].state.served == 1
        assert cluster.daemons["c"].node.resync.stats.completed == 1
        for s in "ab":
            for layer in range(LAYERS):
                np.testing.assert_array_equal(
                    c.state.params[layer], trainers[s].state.params[layer], err_msg=f"c vs {s}, layer {layer}"
                )
