"""What a refused gateway connection leaves behind: a reason in /status, and no task or memory for a
flood of connections that never authenticate."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from gateways.rounds.config import RoundConfig
from gateways.service.peer_links import MAX_PREAUTH_PER_HOST, MAX_PREAUTH_TOTAL
from tests.gateways.service.daemon_fakes import read_until_closed
from tools.harness.daemon_cluster import TEST_TIMEOUTS, running, short_dir, site_configs
from transports import connect

ROUNDS = RoundConfig(topology="star", round_deadline_s=20.0, suspect_after_s=20.0)


@pytest.fixture(autouse=True)
def _numpy_codec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANRT_KERNELS", "numpy")


@pytest.mark.timeout(60)
async def test_status_says_why_a_peer_with_other_round_settings_was_refused() -> None:
    with short_dir() as tmp:
        configs = site_configs(tmp, "ab", rounds=ROUNDS)
        configs["a"] = dataclasses.replace(configs["a"], rounds=dataclasses.replace(ROUNDS, window=5))
        async with running(configs) as cluster:
            b = cluster.daemons["b"]
            await b.wait_for(lambda: b.status()["peers"]["a"]["reason"] != "")
            reason = b.status()["peers"]["a"]["reason"]
            assert reason.startswith("refused:") and "[gateway.rounds]" in reason


@pytest.mark.timeout(60)
async def test_connections_that_never_authenticate_are_capped() -> None:
    with short_dir() as tmp:
        configs = site_configs(tmp, "ab", rounds=ROUNDS)
        async with running(configs) as cluster:
            b = cluster.daemons["b"]
            url = configs["b"].listen
            idle = [await connect(url) for _ in range(MAX_PREAUTH_PER_HOST)]  # each holds a handshake
            await b.wait_for(lambda: sum(map(len, b._peer_links._preauth.values())) == MAX_PREAUTH_PER_HOST)
            extra = await connect(url)
            async with asyncio.timeout(10):
                assert await read_until_closed(extra) == b""  # closed at once, nothing said
            assert b.stats.rejected_connections >= 1
            for t in (*idle, extra):
                await t.close()
            await b.wait_for(lambda: not b._peer_links._preauth)  # every slot given back


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.timeout(60)
async def test_a_flood_from_a_few_hosts_does_not_block_a_peer_rejoining() -> None:
    """Security probe (issue 21): 8 hosts × 8 unauthenticated connections filled all 64 slots and no
    gateway could (re)join while they lasted. A peer from another address now evicts the busiest host's
    oldest handshake and links."""
    hosts = MAX_PREAUTH_TOTAL // MAX_PREAUTH_PER_HOST
    with short_dir() as tmp:
        ports = {s: _free_port() for s in "ab"}
        timeouts = dataclasses.replace(TEST_TIMEOUTS, handshake=30.0)  # the flood holds its slots
        configs = site_configs(tmp, "ab", rounds=ROUNDS, timeouts=timeouts)
        for s in "ab":
            other = "b" if s == "a" else "a"
            configs[s] = dataclasses.replace(
                configs[s],
                listen=f"tcp://127.0.0.1:{ports[s]}",
                peers={other: f"tcp://127.0.0.1:{ports[other]}"},
            )
        async with running(configs) as cluster:
            b = cluster.daemons["b"]
            await b.wait_for(lambda: b.status()["peers"]["a"]["state"] == "up")
            await cluster.kill("a")
            await b.wait_for(lambda: b.status()["peers"]["a"]["state"] != "up")
            flood = []
            for k in range(hosts):
                for _ in range(MAX_PREAUTH_PER_HOST):
                    source = (f"127.0.0.{k + 2}", 0)
                    flood.append(await asyncio.open_connection("127.0.0.1", ports["b"], local_addr=source))
            await b.wait_for(lambda: sum(map(len, b._peer_links._preauth.values())) == MAX_PREAUTH_TOTAL)
            await cluster.start("a")  # dials from 127.0.0.1, a host holding no slot
            await b.wait_for(lambda: b.status()["peers"]["a"]["state"] == "up")
            assert sum(map(len, b._peer_links._preauth.values())) <= MAX_PREAUTH_TOTAL
            capped = f"127.0.0.{hosts + 1}"  # the last flooding host: it still holds all its slots
            more = await asyncio.open_connection("127.0.0.1", ports["b"], local_addr=(capped, 0))
            async with asyncio.timeout(10):  # a flooding host at its cap is still refused at once
                assert await more[0].read() == b""
            for _reader, writer in (*flood, more):
                writer.close()
            await b.wait_for(lambda: not b._peer_links._preauth)
            await cluster.stop_all()


@pytest.mark.timeout(60)
async def test_a_second_training_run_is_refused_with_what_to_do_not_hung() -> None:
    from tools.harness.daemon_cluster import trainers_for
    from tools.harness.daemon_trainer import signature_info

    with short_dir() as tmp:
        configs = site_configs(tmp, "a", rounds=ROUNDS)
        async with running(configs) as cluster:
            first = trainers_for(cluster, layers=2, iterations=3, info={**signature_info(2), "run": "run-1"})[
                "a"
            ]
            await first.connect()
            await first.run()
            await first.wait_all(3)
            await first.close()
            again = trainers_for(cluster, layers=2, iterations=3, info={**signature_info(2), "run": "run-1"})[
                "a"
            ]
            await again.connect()  # the same run reconnecting is served
            await again.close()
            second = trainers_for(
                cluster, layers=2, iterations=3, info={**signature_info(2), "run": "run-2"}
            )["a"]
            await second.connect()
            async with asyncio.timeout(10):
                await second.wait(lambda: bool(second.errors))
            assert "another training run" in second.errors[0] and "restart" in second.errors[0]
            await second.close()


@pytest.mark.timeout(60)
async def test_a_site_whose_trainer_is_missing_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    from tools.harness.daemon_cluster import trainers_for

    fast = RoundConfig(topology="star", round_deadline_s=0.2, suspect_after_s=20.0)
    with short_dir() as tmp:
        # b never took part: warned about once missing for absent_warn_after_s (a normal start is not)
        configs = site_configs(tmp, "abc", rounds=fast, root="a", absent_warn_after_s=0.3)
        async with running(configs) as cluster:
            trainers = trainers_for(cluster, layers=1, iterations=8)
            del trainers["b"]  # b's gateway is up, its trainer never comes
            for t in trainers.values():
                await t.connect()
            async with asyncio.timeout(30):
                await asyncio.gather(*(t.run() for t in trainers.values()))
                for t in trainers.values():
                    await t.wait_all(8)
            a = cluster.daemons["a"]
            assert a.status()["missing_rounds"].get("b", 0) >= 3
            assert any("without site b" in r.getMessage() for r in caplog.records)
            for t in trainers.values():  # and every training site's trainer was told, not only the log
                assert any(n.site == "b" and n.kind == "trainer" and not n.fatal for n in t.notices)
            for t in trainers.values():
                await t.close()


@pytest.mark.timeout(60)
async def test_a_trainer_starting_late_at_a_normal_start_is_not_called_missing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 21: every normal start logged "rounds complete without site a (3 in a row): is its trainer
    running?" because trainers are launched seconds apart."""
    from tools.harness.daemon_cluster import trainers_for

    fast = RoundConfig(topology="star", round_deadline_s=0.2, suspect_after_s=20.0)
    with short_dir() as tmp:
        configs = site_configs(tmp, "abc", rounds=fast, root="a")
        async with running(configs) as cluster:
            trainers = trainers_for(cluster, layers=1, iterations=12)
            late = trainers.pop("b")
            for t in trainers.values():
                await t.connect()
            runs = [asyncio.create_task(t.run()) for t in trainers.values()]
            a = cluster.daemons["a"]
            await a.wait_for(lambda: a.status()["missing_rounds"].get("b", 0) >= 5)  # rounds without b
            await late.connect()
            runs.append(asyncio.create_task(late.run()))
            async with asyncio.timeout(30):
                await asyncio.gather(*runs)
                for t in (*trainers.values(), late):
                    await t.wait_all(12)
            assert not any("without site b" in r.getMessage() for r in caplog.records)
            assert not any(n.kind == "trainer" for t in trainers.values() for n in t.notices)
            assert not a.status()["faults"] and "b" in a.stats.contributed
            for t in (*trainers.values(), late):
                await t.close()


@pytest.mark.timeout(60)
async def test_unauthenticated_hellos_naming_a_peer_do_not_delay_its_join() -> None:
    """Reliability item 10: a Hello naming site a that never authenticates held b's pre-join handshake
    gate for the whole handshake timeout (a's rejoin went from 2.8 s to 12–26 s)."""
    from tests.gateways.service.daemon_fakes import FakePeer
    from tools.harness.daemon_cluster import JOB, Cluster
    from wanrt.protocol import Connection

    with short_dir() as tmp:
        configs = site_configs(tmp, "ab", rounds=ROUNDS)
        for s, cfg in configs.items():  # far longer than the join may take
            configs[s] = dataclasses.replace(cfg, timeouts=dataclasses.replace(cfg.timeouts, handshake=30.0))
        cluster = Cluster(configs)
        try:
            b = await cluster.start("b")
            stallers = []
            for _ in range(3):
                t = await connect(configs["b"].listen)
                conn = Connection("gateway", "a", JOB, b"x" * 32, side="client")
                await t.send([conn.hello(FakePeer("a", JOB, b"x" * 32, ROUNDS).info())])
                stallers.append(t)  # ... and never authenticates
            assert await stallers[0].recv()  # b answered the first (its Welcome) and waits for its Auth
            await cluster.start("a")
            async with asyncio.timeout(10):  # a third of one handshake timeout
                await b.wait_for(lambda: b.status()["peers"]["a"]["state"] == "up")
            for t in stallers:
                await t.close()
            await cluster.stop_all()
        finally:
            await cluster.aclose()
