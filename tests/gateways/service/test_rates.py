"""A slow WAN link makes its gateway's rate allocator shift rate towards it (seed 002), from link times the
daemon measures itself; an emulated link follows its bandwidth trace."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from gateways.config import PeerShape
from gateways.rounds.config import RoundConfig
from tools.harness.daemon_cluster import running, short_dir, site_configs, trainers_for
from transports import BandwidthTrace, ShapedTransport


@pytest.fixture(autouse=True)
def _numpy_codec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANRT_KERNELS", "numpy")


@pytest.mark.timeout(120)
async def test_straggling_link_gets_more_rate_and_the_trace_drives_the_emulated_link() -> None:
    rounds = RoundConfig(topology="star", round_deadline_s=20.0, suspect_after_s=20.0)
    with short_dir() as tmp:
        trace = tmp / "d.csv"
        BandwidthTrace.from_pairs([(0.0, 200e6), (0.2, 50e6)]).save(trace)
        configs = site_configs(tmp, "abcd", rounds=rounds, root="a")
        # what a (the star's root) sends to d crosses a 40 ms link whose bandwidth follows the trace
        configs["a"] = dataclasses.replace(
            configs["a"], shaping={"d": PeerShape(200e6, delay_s=0.04, trace=str(trace))}
        )
        async with running(configs) as cluster:
            a = cluster.daemons["a"]
            trainers = trainers_for(cluster, layers=2, iterations=25)
            for t in trainers.values():
                await t.connect()
            async with asyncio.timeout(100):
                await asyncio.gather(*(t.run() for t in trainers.values()))
                for t in trainers.values():
                    await t.wait_all(25)
            link = a.links()["d"]
            assert isinstance(link.transport, ShapedTransport)
            assert link.transport.rate_bps == 50e6  # the trace's second step
            snap = a.allocator.snapshot()
            base = configs["a"].link_rate_bps
            assert snap.reallocations >= 1
            assert snap.links["d"].rate_bps > base  # the straggling link got more
            assert snap.links["b"].rate_bps < base and snap.links["c"].rate_bps < base  # the donors
            channel = a.node.channel(link.link_id)
            assert channel is not None
            assert channel.pacer.rate_bps == snap.links["d"].rate_bps  # applied to the link's pacer
            status = a.status()
            assert status["rates"]["reallocations"] == snap.reallocations
            assert status["peers"]["d"]["rate_bps"] == snap.links["d"].rate_bps
            assert status["peers"]["d"]["last_link_time_s"] > 0.04
            for t in trainers.values():
                await t.close()
            await cluster.stop_all()
