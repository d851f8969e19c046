"""A gateway dies mid-run (its task cancelled: every socket dropped, no Bye) and is started again: the others
keep completing rounds without it, it rejoins at an agreed iteration, its trainer sends what was never
acknowledged again, and in the end every pushed payload is counted exactly once."""

from __future__ import annotations

import asyncio
from collections import Counter

import numpy as np
import pytest

from gateways.rounds.config import RoundConfig
from tests.gateways.harness import layer_shape
from tools.harness.daemon_cluster import (
    add_held,
    dense_sum,
    running,
    sent,
    short_dir,
    site_configs,
    trainers_for,
)
from wanrt.protocol.peer.round_msg import ContribId

ITERATIONS = 60
LAYERS = 4
K = 15  # the iteration d dies in


@pytest.fixture(autouse=True)
def _numpy_codec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANRT_KERNELS", "numpy")


@pytest.mark.timeout(180)
async def test_killed_gateway_rejoins_and_every_push_is_counted_once() -> None:
    # tree a -> (b, c), b -> d: d is a leaf, so every result comes from the root and stays consistent
    rounds = RoundConfig(topology="tree", round_deadline_s=5.0, suspect_after_s=5.0)
    with short_dir() as tmp:
        async with running(site_configs(tmp, "abcd", rounds=rounds)) as cluster:
            trainers = trainers_for(cluster, layers=LAYERS, iterations=ITERATIONS)
            for t in trainers.values():
                await t.connect()
            runs = [asyncio.create_task(t.run()) for t in trainers.values()]
            a = trainers["a"]
            async with asyncio.timeout(150):
                # a, b and c stop before iteration K; d pushes K and its gateway forwards it to b, where the
                # round waits for b's own push: d dies with its contribution to K counted nowhere
                for s in "abc":
                    trainers[s].allow_until(K)
                await cluster.wait_action("d", lambda acts: sent(acts, K) == set(range(LAYERS)))
                await cluster.kill("d")
                for s in "abc":
                    trainers[s].allow_until(None)
                down_at = K
                # the others keep going without d
                await a.wait(lambda: (down_at + 8, 0) in a.aggregates)
                new_d = await cluster.start("d")
                await new_d.wait_joined()
                unacked_before = len(trainers["d"].unacked)
                welcome = await trainers["d"].reconnect()
                await asyncio.gather(*runs)
                for t in trainers.values():
                    await t.wait_all(ITERATIONS)
                    # a root acks a push once a peer has the result: just after the aggregate, not with it
                    await t.wait(lambda t=t: not t.unacked)  # type: ignore[misc]
            for t in trainers.values():
                await t.close()
            await cluster.stop_all()

        join_at = welcome.info["join_at"]
        assert isinstance(join_at, int) and join_at > down_at
        survivors = "abc"
        finals = cluster.delivered("a")
        for s in "bc":  # the survivors delivered identical results
            other = cluster.delivered(s)
            assert other.keys() == finals.keys()
            for key, d in other.items():
                assert d.sites == finals[key].sites
                assert d.payload is not None and finals[key].payload is not None
                assert d.payload.values_f32().tobytes() == finals[key].payload.values_f32().tobytes()
        # rounds finished without d while it was down
        assert any(
            all(s != "d" for s, _ in d.sites) for (it, _), d in finals.items() if down_at < it < join_at
        )
        pushed = {(s, it, layer): p for s, t in trainers.items() for (it, layer), p in t.pushed.items()}
        for layer in range(LAYERS):
            seen: Counter[ContribId] = Counter()
            got = np.zeros(layer_shape(layer)[0], np.float32)
            for (_, lay), d in finals.items():
                if lay == layer:
                    assert d.payload is not None
                    d.payload.add_into(got)
                    seen.update(d.sites)
            add_held(cluster, survivors + "d", layer, got, seen)  # what is still held anywhere
            assert all(n == 1 for n in seen.values()), f"layer {layer}: counted twice: {seen.most_common(3)}"
            assert set(seen) <= {(s, it) for s, it, lay in pushed if lay == layer}
            expect = dense_sum((p for (_, _, lay), p in pushed.items() if lay == layer), layer)
            np.testing.assert_array_equal(got, expect, err_msg=f"layer {layer}: pushes lost or doubled")
        assert all(not t.unacked for t in trainers.values())
        for s in survivors:
            st = cluster.stats[s]
            # 2, or 3 when d's first handshake after the restart straddled another link's and was redone
            assert st["peers_lost"] >= 1 and st["per_peer"]["d"]["connects"] in (2, 3)
        # d's push of K was sent again and, counted nowhere, folded into a later push of the same layer
        assert unacked_before >= LAYERS
        ledger = cluster.daemons["d"].status()["trainer"]["ledger"]
        assert ledger["recovered_folded"] >= LAYERS and ledger["conflicts"] == 0
        assert ledger["recovered_counted"] + ledger["recovered_folded"] == unacked_before


@pytest.mark.timeout(120)
async def test_link_failure_between_two_gateways_loses_nothing() -> None:
    """The only link of a two-site job breaks mid-run: each side is cut off from the majority, holds its
    rounds, and settles them when the link is back (the contributions go into later rounds); the trainers
    get empty results for the settled rounds instead of waiting forever, and every push is counted once."""
    rounds = RoundConfig(topology="star", round_deadline_s=5.0, suspect_after_s=5.0)
    with short_dir() as tmp:
        async with running(site_configs(tmp, "ab", rounds=rounds)) as cluster:
            trainers = trainers_for(cluster, layers=LAYERS, iterations=30)
            for t in trainers.values():
                await t.connect()
            runs = [asyncio.create_task(t.run()) for t in trainers.values()]
            a = cluster.daemons["a"]
            async with asyncio.timeout(100):
                await trainers["a"].wait(lambda: (10, 0) in trainers["a"].aggregates)
                link = a.links()["b"]
                abort = getattr(link.transport, "abort", None)
                assert abort is not None
                abort()  # the network drops the connection (a reset, no Bye)
                await a.wait_for(lambda: a.status()["peers"]["b"]["connects"] == 2)
                await asyncio.gather(*runs)
                for t in trainers.values():
                    await t.wait_all(30)
            for t in trainers.values():
                await t.close()
            await cluster.stop_all()

        finals = cluster.delivered("a")
        assert finals.keys() == cluster.delivered("b").keys()
        # both gateways kept running, so each takes the other back into every round still open (both
        # hold them: neither has a quorum alone) and they finish with results; a round settled without
        # one (had either fallen behind) is answered with an empty aggregate, never left waiting
        settled = trainers["a"].aggregates.keys() - finals.keys()
        for key in settled:  # answered with an empty aggregate, so the trainer did not wait for it
            agg = trainers["a"].aggregates[key]
            assert agg.payload.nnz_blocks == 0 and agg.sites == ("a",)
        pushed = [(t.pushed, s) for s, t in trainers.items()]
        for layer in range(LAYERS):
            got = np.zeros(layer_shape(layer)[0], np.float32)
            seen: Counter[ContribId] = Counter()
            for (_, lay), d in finals.items():
                if lay == layer:
                    assert d.payload is not None
                    d.payload.add_into(got)
                    seen.update(d.sites)
            assert all(n == 1 for n in seen.values())
            expect = dense_sum((p for tp, _ in pushed for (_, lay), p in tp.items() if lay == layer), layer)
            np.testing.assert_array_equal(got, expect)
        # the rounds held across the reset were re-run by both and finished with results: none abandoned
        assert not settled and len(finals) == 30 * LAYERS


@pytest.mark.timeout(120)
async def test_gateways_restarted_together_resume_the_job_past_where_it_was() -> None:
    """Reliability item 12: two gateways restarted together started a new job at iteration 0 while their
    trainers were at iteration K; with ``state_file`` they resume past every iteration the job had seen,
    and the trainers' re-sent pushes are carried into the resumed rounds (every payload counted once)."""
    import dataclasses

    rounds = RoundConfig(topology="star", round_deadline_s=5.0, suspect_after_s=5.0)
    iterations, k = 20, 6
    with short_dir() as tmp:
        configs = site_configs(tmp, "ab", rounds=rounds)
        for s, cfg in configs.items():
            configs[s] = dataclasses.replace(cfg, state_file=str(tmp / f"state-{s}.json"))
        async with running(configs) as cluster:
            trainers = trainers_for(cluster, layers=2, iterations=iterations)
            for t in trainers.values():
                await t.connect()
                t.allow_until(k)
            runs = [asyncio.create_task(t.run()) for t in trainers.values()]
            async with asyncio.timeout(100):
                for t in trainers.values():
                    await t.wait(lambda t=t: (k - 1, 1) in t.aggregates)  # type: ignore[misc]
                seen = max(cluster.daemons[s].engine.frontier for s in "ab")
                for s in "ab":
                    await cluster.kill(s)
                restarted = {s: await cluster.start(s) for s in "ab"}
                for d in restarted.values():
                    await d.wait_joined()
                    assert d.join_at is not None and d.join_at > seen  # not a new job at iteration 0
                welcomes = {s: await trainers[s].reconnect() for s in "ab"}
                for t in trainers.values():
                    t.allow_until(None)
                await asyncio.gather(*runs)
                for t in trainers.values():
                    await t.wait_all(iterations)
                    await t.wait(lambda t=t: not t.unacked)  # type: ignore[misc]  # (see above)
            for s, w in welcomes.items():
                assert w.info["join_at"] == restarted[s].join_at
            for t in trainers.values():
                assert not t.unacked
                await t.close()
            finals = cluster.delivered("a")  # both generations of gateway a
            for layer in range(2):
                got = np.zeros(layer_shape(layer)[0], np.float32)
                for (_, lay), d in finals.items():
                    if lay == layer and d.payload is not None:
                        d.payload.add_into(got)
                pushed = (p for t in trainers.values() for (_, lay), p in t.pushed.items() if lay == layer)
                np.testing.assert_array_equal(got, dense_sum(pushed, layer), err_msg="pushes lost or doubled")
            await cluster.stop_all()
