"""Bad input from the network costs only the connection it came on: strangers sending garbage, oversized
frame headers or the wrong secret are refused with a log line, an authenticated peer that breaks the round
protocol or goes silent is declared lost, and the gateways keep serving each other and their trainers."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import numpy as np
import pytest

from gateways.rounds.config import RoundConfig
from gateways.service.daemon import GatewayDaemon
from tests.gateways.service.daemon_fakes import FakePeer, oversized_header, read_until_closed
from tools.harness.daemon_cluster import (
    JOB,
    SECRET,
    dense_sum,
    running,
    short_dir,
    site_configs,
    trainers_for,
)
from tools.harness.daemon_trainer import FakeTrainer
from transports import Timeouts, connect
from wanrt.errors import RemoteProtocolError
from wanrt.protocol.peer.round_frames import RoundTag

ROUNDS = RoundConfig(topology="star", round_deadline_s=20.0, suspect_after_s=20.0)


@pytest.fixture(autouse=True)
def _numpy_codec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANRT_KERNELS", "numpy")


def _lost(daemon: GatewayDaemon, peer: str) -> bool:
    return daemon.engine is not None and peer not in daemon.engine.live


async def _short_job(cluster: object, sites: str, iterations: int = 6, layers: int = 3) -> None:
    """The real gateways still serve their trainers: a short job, summed exactly over ``sites``."""
    from tools.harness.daemon_cluster import Cluster

    assert isinstance(cluster, Cluster)
    trainers = {
        s: t for s, t in trainers_for(cluster, layers=layers, iterations=iterations).items() if s in sites
    }
    for t in trainers.values():
        await t.connect()
    async with asyncio.timeout(60):
        await asyncio.gather(*(t.run() for t in trainers.values()))
        for t in trainers.values():
            await t.wait_all(iterations)
    for (it, layer), agg in trainers[sites[0]].aggregates.items():
        assert agg.sites == tuple(sites)
        expect = dense_sum((t.pushed[(it, layer)] for t in trainers.values()), layer)
        np.testing.assert_array_equal(agg.payload.to_dense(), expect)
    for t in trainers.values():
        await t.close()


@pytest.mark.timeout(120)
async def test_strangers_and_a_rule_breaking_peer_lose_only_their_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    with short_dir() as tmp:
        configs = site_configs(tmp, "abcd", rounds=ROUNDS, root="b")
        del configs["a"]  # site a is played by the test
        async with running(configs) as cluster:
            b = cluster.daemons["b"]
            peer_url, trainer_url = configs["b"].listen, configs["b"].trainer_listen
            # 1. garbage: an HTTP request on the gateway port and on the trainer port
            for url in (peer_url, trainer_url):
                t = await connect(url)
                await t.send([b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"])
                assert await read_until_closed(t) != b""  # an Error frame, then EOF
                await t.close()
            # 2. a frame header announcing 2 GiB: refused from its 24 bytes
            t = await connect(peer_url)
            await t.send([oversized_header()])
            await read_until_closed(t)
            await t.close()
            # 3. the wrong secret, both as the real client reacts (abort) and with a forged proof
            intruder = FakePeer("a", JOB, b"not-the-secret-of-this-job", ROUNDS)
            for forge in (False, True):
                error, said = await intruder.wrong_secret(peer_url, forge_auth=forge)
                assert "proof" in error and said is not None
            # 4. a gateway that is not part of the job
            stranger = FakePeer("aa", JOB, SECRET.encode(), ROUNDS)
            error, said = await stranger.wrong_secret(peer_url, forge_auth=False)
            assert b"not a peer" in said
            # 5. site a, with the right secret, joins every gateway, then sends b a round message naming a
            #    site that is not in the job: b closes that link; a then leaves the others
            fake = FakePeer("a", JOB, SECRET.encode(), ROUNDS)
            links = {s: await fake.handshake(configs[s].listen) for s in "bcd"}
            await b.wait_for(lambda: b.status()["peers"]["a"]["state"] == "up")
            conn, transport = links["b"]
            bad = RoundTag(0, "partial", 0, 0, 1, 0, -1, (("zz", 0),), False)
            await transport.send(conn.send_parts(bad))
            assert b"contribution id" in await read_until_closed(transport)
            for s in "cd":
                await links[s][1].close()
            for s in "bcd":
                await cluster.daemons[s].wait_for(lambda d=cluster.daemons[s]: _lost(d, "a"))  # type: ignore[misc]

            assert b.stats.rejected_connections >= 5
            assert b.status()["peers"]["a"]["state"] == "lost"
            assert "protocol violation" in b.status()["peers"]["a"]["reason"]
            await _short_job(cluster, "bcd")
            assert all(
                cluster.daemons[s].status()["peers"][p]["connects"] == 1
                for s in "bcd"
                for p in "bcd"
                if p != s
            )
            await cluster.stop_all()
    text = caplog.text
    assert "bad magic" in text or "magic" in text
    assert "max_frame_bytes" in text or "too large" in text
    assert "proof" in text  # wrong secret, logged
    assert "not a peer" in text
    assert "peer a lost: protocol violation" in text


@pytest.mark.timeout(60)
async def test_silent_peer_is_declared_lost_by_its_heartbeats(caplog: pytest.LogCaptureFixture) -> None:
    fast = Timeouts(connect=5.0, handshake=5.0, close=1.0, heartbeat_interval=0.2, heartbeat_misses=3)
    with short_dir() as tmp:
        configs = site_configs(tmp, "abc", rounds=ROUNDS, root="b", timeouts=fast)
        del configs["a"]
        async with running(configs) as cluster:
            fake = FakePeer("a", JOB, SECRET.encode(), ROUNDS)
            links = [await fake.handshake(configs[s].listen) for s in "bc"]  # then never a word
            for s in "bc":
                await cluster.daemons[s].wait_for(lambda d=cluster.daemons[s]: _lost(d, "a"))  # type: ignore[misc]
            status = cluster.daemons["b"].status()
            assert status["peers"]["a"]["state"] == "lost"
            assert "no heartbeat" in status["peers"]["a"]["reason"]
            assert status["live"] == ["b", "c"]
            await _short_job(cluster, "bc")
            for _, t in links:
                await t.close()
            await cluster.stop_all()
    assert "peer a lost: peer silent: no heartbeat" in caplog.text


@pytest.mark.timeout(60)
async def test_trainer_of_another_site_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    with short_dir() as tmp:
        configs = site_configs(tmp, "ab", rounds=ROUNDS)
        async with running(configs) as cluster:
            wrong = FakeTrainer(
                configs["a"].trainer_listen, "b", JOB, SECRET.encode(), layers=1, iterations=1
            )
            with pytest.raises(RemoteProtocolError, match=r"Reject"):
                await wrong.connect()
            await _short_job(cluster, "ab", iterations=3, layers=2)
            await cluster.stop_all()
    assert "trainer of site 'b' refused: only the trainer of site 'a' may connect here" in caplog.text


@pytest.mark.timeout(60)
async def test_a_site_that_never_comes_is_declared_lost_when_a_round_needs_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Ring a → b → c → a with c never started: a waits for its ring predecessor c, and the round engine
    reports it silent; c has no link, so a declares it lost. b does not wait for c, but gives it the same
    time to link as a heartbeat: both count c out and the ring closes without it."""
    rounds = RoundConfig(topology="ring", round_deadline_s=0.3, suspect_after_s=0.3)
    fast = Timeouts(connect=5.0, handshake=5.0, close=1.0, heartbeat_interval=0.2, heartbeat_misses=3)
    with short_dir() as tmp:
        configs = site_configs(tmp, "abc", rounds=rounds, timeouts=fast)
        del configs["c"]
        async with running(configs) as cluster:
            await _short_job(cluster, "ab", iterations=4, layers=2)
            for s in "ab":
                st = cluster.daemons[s].status()
                assert st["live"] == ["a", "b"] and st["peers"]["c"]["state"] == "lost"
                assert st["counters"]["suspects"] >= 1
            await cluster.stop_all()
    assert "peer c lost: silent for" in caplog.text or "peer c lost: no link within 0.6 s" in caplog.text


@pytest.mark.timeout(60)
@pytest.mark.parametrize("join_at", [None, 1_000_000])
async def test_a_claimed_far_frontier_does_not_lift_the_join_bound(join_at: int | None) -> None:
    """Security probe (issue 21): a member with its own valid keys claiming frontier 999 987 (and join_at
    10⁶, or no join_at: the join rule then puts it at its frontier + 1 + a window) was accepted and listed
    live. The bound is this site's own frontier, not the claim."""
    from gateways.membership.joining import LinkInfo, rounds_digest
    from tools.harness.daemon_cluster import trainers_for

    class FarPeer(FakePeer):
        def info(self) -> dict[str, Any]:
            info = LinkInfo(frontier=999_987, fresh=False, join_at=join_at).to_info()
            info["rounds"] = rounds_digest(self.rounds)
            return info

    with short_dir() as tmp:
        configs = site_configs(tmp, "ab", rounds=ROUNDS)
        async with running(configs) as cluster:
            trainers = trainers_for(cluster, layers=1, iterations=3)
            for t in trainers.values():
                await t.connect()
            await asyncio.gather(*(t.run() for t in trainers.values()))
            for t in trainers.values():
                await t.wait_all(3)
                await t.close()
            await cluster.kill("a")
            b = cluster.daemons["b"]
            await b.wait_for(lambda: b.status()["peers"]["a"]["state"] != "up")
            frontier = b.engine.frontier
            _conn, transport = await FarPeer("a", JOB, SECRET.encode(), ROUNDS).handshake(configs["b"].listen)
            assert await read_until_closed(transport)
            await b.wait_for(lambda: "claims frontier 999987" in b.status()["peers"]["a"]["reason"])
            assert b.engine.frontier == frontier and "a" not in b.engine.live
            assert b.status()["live"] == ["b"]
            await cluster.stop_all()


@pytest.mark.timeout(60)
async def test_a_peer_claiming_a_far_join_iteration_is_refused_and_moves_nothing() -> None:
    """Reliability item 8: after announcing ``join_at`` 500 a peer holding the secret could open the window
    far ahead and finalise rounds hundreds of iterations ahead of the job."""
    from gateways.membership.joining import LinkInfo, rounds_digest
    from tools.harness.daemon_cluster import trainers_for

    class FarPeer(FakePeer):
        def info(self) -> dict[str, Any]:
            info = LinkInfo(frontier=3, fresh=False, join_at=500).to_info()
            info["rounds"] = rounds_digest(self.rounds)
            return info

    with short_dir() as tmp:
        configs = site_configs(tmp, "ab", rounds=ROUNDS)
        async with running(configs) as cluster:
            trainers = trainers_for(cluster, layers=1, iterations=3)
            for t in trainers.values():
                await t.connect()
            await asyncio.gather(*(t.run() for t in trainers.values()))
            for t in trainers.values():
                await t.wait_all(3)
                await t.close()
            await cluster.kill("a")
            b = cluster.daemons["b"]
            await b.wait_for(lambda: b.status()["peers"]["a"]["state"] != "up")
            frontier = b.engine.frontier
            _conn, transport = await FarPeer("a", JOB, SECRET.encode(), ROUNDS).handshake(configs["b"].listen)
            assert await read_until_closed(transport)  # an Error frame saying why, then the close
            await b.wait_for(lambda: "claims join_at 500" in b.status()["peers"]["a"]["reason"])
            assert b.engine.frontier == frontier and "a" not in b.engine.live
            await cluster.stop_all()
