"""What a site sees of its gateway: /metrics, /status, POST /config, a trainer served again after it
reconnects, and the job's model signature handed to every trainer (the real client refuses another model)."""

from __future__ import annotations

import asyncio
import dataclasses
import socket

import aiohttp
import pytest

from gateways.config import PeerShape
from gateways.rounds.config import RoundConfig
from tools.harness.daemon_cluster import JOB, SECRET, running, short_dir, site_configs, trainers_for
from tools.harness.daemon_trainer import signature_info

ROUNDS = RoundConfig(topology="star", round_deadline_s=20.0, suspect_after_s=20.0)


@pytest.fixture(autouse=True)
def _numpy_codec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANRT_KERNELS", "numpy")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(90)
async def test_metrics_status_config_and_a_reconnecting_trainer() -> None:
    with short_dir() as tmp:
        configs = site_configs(tmp, "ab", rounds=ROUNDS)
        token = tmp / "token"
        token.write_text("gateway-control-token-0123456789\n")
        configs["a"] = site_configs(
            tmp, "ab", rounds=ROUNDS, metrics_port=_free_port(), control_token_file=str(token)
        )["a"]
        auth = {"Authorization": "Bearer gateway-control-token-0123456789"}
        async with running(configs) as cluster, aiohttp.ClientSession(headers=auth) as http:
            url = cluster.daemons["a"].ready_info()["metrics_url"]
            assert url is not None and url.startswith("http://127.0.0.1:")
            trainers = trainers_for(cluster, layers=2, iterations=8)
            for t in trainers.values():
                t.allow_until(4)
                await t.connect()
            runs = [asyncio.create_task(t.run()) for t in trainers.values()]
            a = trainers["a"]
            await a.wait_all(4)

            async with http.post(f"{url}/config", json={"values": {"density": 0.05, "staleness": 1}}) as r:
                assert r.status == 200
                applied = await r.json()
            assert applied["forwarded"] and applied["effective_iteration"] > 3
            await a.wait(lambda: len(a.configs) == 1)
            assert a.configs[0].values == {"density": 0.05, "staleness": 1}
            for bad in (
                {"values": {"lr": 1.0}},
                {"values": {"density": 2.0}},
                {"values": {"staleness": -1}},
                {"values": {"batch_size": 0}},
                {"values": {}, "extra": 1},
                [1, 2],
            ):
                async with http.post(f"{url}/config", json=bad) as r:
                    assert r.status == 400, bad
                    assert "error" in await r.json()
            as_json = {"Content-Type": "application/json"}
            async with http.post(f"{url}/config", data=b"{not json", headers=as_json) as r:
                assert r.status == 400
            async with http.post(f"{url}/config", data=b"[" * 5000, headers=as_json) as r:
                assert r.status == 400 and "nested" in (await r.json())["error"]  # no RecursionError/500
            body = {"values": {"density": 0.5}}
            async with aiohttp.ClientSession() as anonymous, anonymous.post(f"{url}/config", json=body) as r:
                assert r.status == 401  # no token: any local user
            text = {"Content-Type": "text/plain"}  # a cross-origin form post
            async with http.post(f"{url}/config", data=b'{"values": {"density": 0.5}}', headers=text) as r:
                assert r.status == 415
            assert len(a.configs) == 1  # none of the refused calls changed anything

            # the trainer goes away and comes back: served again, with the last configuration
            await a.close()
            await a.connect(resend=True)
            await a.wait(lambda: len(a.configs) == 2)
            for t in trainers.values():
                t.allow_until(None)
            await asyncio.gather(*runs)
            for t in trainers.values():
                await t.wait_all(8)
            assert a.aggregates.keys() == trainers["b"].aggregates.keys()

            async with http.get(f"{url}/status") as r:
                status = await r.json()
            assert status["site"] == "a" and status["state"] == "running"
            assert status["frontier"] == 7 and status["open_rounds"] == 0
            assert status["peers"]["b"]["state"] == "up" and status["peers"]["b"]["live"]
            assert status["peers"]["b"]["rate_bps"] == configs["a"].link_rate_bps
            assert status["trainer"]["connected"] and status["counters"]["trainer_connections"] == 2
            assert status["recent_rounds"] and status["recent_rounds"][-1]["delivered"]
            assert status["model"]["site"] in ("a", "b")
            async with http.get(f"{url}/metrics") as r:
                assert r.status == 200 and r.content_type == "text/plain"
                text = await r.text()
            lines = {ln.split(" ")[0]: ln.split(" ")[1] for ln in text.splitlines() if not ln.startswith("#")}
            assert float(lines['wanrt_gateway_rounds_completed_total{site="a"}']) == 16
            assert float(lines['wanrt_gateway_bytes_sent_total{site="a",peer="b"}']) > 0
            assert float(lines['wanrt_gateway_bytes_received_total{site="a",peer="b"}']) > 0
            assert lines['wanrt_gateway_peer_up{site="a",peer="b"}'] == "1"
            assert (
                float(lines['wanrt_gateway_link_rate_bps{site="a",peer="b"}']) == configs["a"].link_rate_bps
            )
            assert 'wanrt_gateway_queue_bytes{site="a",peer="b"}' in lines
            assert 'wanrt_gateway_stragglers{site="a"}' in lines
            assert lines['wanrt_gateway_late_contributions_total{site="a"}'] == "0"
            for t in trainers.values():
                await t.close()
            await cluster.stop_all()


@pytest.mark.timeout(90)
async def test_every_trainer_gets_the_jobs_model_and_the_real_client_refuses_another() -> None:
    from wanrt.client.config import ClientConfig
    from wanrt.client.errors import ModelMismatch
    from wanrt.client.link.api import LinkSpec
    from wanrt.client.link.gateway_link import open_gateway_link
    from wanrt.client.link.signature import LayerSignature

    with short_dir() as tmp:
        configs = site_configs(tmp, "ab", rounds=ROUNDS)
        async with running(configs) as cluster:
            trainers = trainers_for(cluster, layers=3, iterations=2)
            a = trainers["a"]
            await a.connect()  # site a's trainer presents the model first
            await cluster.daemons["b"].wait_for(lambda: cluster.daemons["b"].model.current is not None)
            # the model travelled to b: b hands it to its own trainer in the Welcome
            welcome = await trainers["b"].connect()
            assert welcome.info["model"] == signature_info(3)["model"]
            assert welcome.info["model_site"] == "a"
            await trainers["b"].close()

            other = LayerSignature.of(["w0", "w1", "w2"], [(8, 8), (8, 9), (8, 8)], ["float32"] * 3)
            spec = LinkSpec(configs["b"].trainer_listen, "b", JOB, SECRET.encode(), other, ClientConfig())
            with pytest.raises(ModelMismatch) as err:
                await asyncio.to_thread(open_gateway_link, spec)
            assert err.value.layer == 0 and "trained by site a" in err.value.message
            # a trainer that ignores the Welcome and connects anyway is refused by the gateway itself
            rogue = trainers_for(cluster, layers=3, iterations=2, info=signature_info(3, "x"))["b"]
            await rogue.connect()
            await rogue.wait(lambda: bool(rogue.errors))
            assert "differs from the job's model" in rogue.errors[0]
            await a.close()
            await cluster.stop_all()


@pytest.mark.timeout(60)
async def test_a_stopping_gateway_says_goodbye_through_an_emulated_link() -> None:
    """Phase 3 of a shutdown: the Bye travels the emulated WAN link (20 ms) before the socket closes, so the
    peer knows the gateway left on purpose."""
    with short_dir() as tmp:
        configs = site_configs(tmp, "ab", rounds=ROUNDS)
        for s, cfg in configs.items():
            configs[s] = dataclasses.replace(
                cfg, shaping={p: PeerShape(100e6, delay_s=0.02) for p in cfg.peers}
            )
        async with running(configs) as cluster:
            a, b = cluster.daemons["a"], cluster.daemons["b"]
            await b.wait_for(lambda: b.status()["peers"]["a"]["state"] == "up")
            a.request_stop()
            stats = await cluster.tasks.pop("a")
            await b.wait_for(lambda: b.status()["peers"]["a"]["state"] != "up")
            assert b.status()["peers"]["a"]["reason"] == "peer closed the link: gateway shutting down"
            assert stats["per_peer"]["b"]["state"] == "down"
            await cluster.stop_all()
