"""A site whose trainer runs another model stops the job at start-up at every site within seconds, with
``ModelMismatch`` naming the first differing layer whichever site started first (reliability items 2, 3);
refused gateway links reach the trainer as warnings."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from gateways.rounds.config import RoundConfig
from tools.harness.daemon_cluster import JOB, SECRET, running, short_dir, site_configs, trainers_for

ROUNDS = RoundConfig(topology="star", round_deadline_s=20.0, suspect_after_s=20.0)
#: far below the trainer's update deadline (120 s): the point is that nobody waits for it
PROMPT_S = 10.0


@pytest.fixture(autouse=True)
def _numpy_codec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANRT_KERNELS", "numpy")


def _specs(configs: dict, wide_site: str) -> dict:
    from wanrt.client.config import ClientConfig
    from wanrt.client.link.api import LinkSpec
    from wanrt.client.link.signature import LayerSignature

    names = ["w0", "w1"]
    out = {}
    for s, cfg in configs.items():
        shapes = [(8, 8), (8, 9) if s == wide_site else (8, 8)]
        sig = LayerSignature.of(names, shapes, ["float32"] * 2)
        out[s] = LinkSpec(cfg.trainer_listen, s, JOB, SECRET.encode(), sig, ClientConfig())
    return out


def _open_and_wait(spec: object) -> BaseException | None:
    """The site leader's view: open the link, then wait for an update; what it raises (None: nothing)."""
    from wanrt.client.link.gateway_link import open_gateway_link

    try:
        link = open_gateway_link(spec)  # type: ignore[arg-type]
    except Exception as exc:
        return exc
    try:
        deadline = time.monotonic() + PROMPT_S
        while time.monotonic() < deadline:
            link.get(0.2)
        return None
    except Exception as exc:
        return exc
    finally:
        link.close(2.0)


def _assert_mismatch_at_layer_1(err: BaseException | None, site: str) -> None:
    from wanrt.client.errors import ModelMismatch

    assert isinstance(err, ModelMismatch), (site, err)
    assert err.fields["layer"] == 1 and err.fields["name"] == "w1", (site, err.fields)


@pytest.mark.timeout(60)
async def test_started_together_every_site_gets_model_mismatch_naming_the_layer() -> None:
    with short_dir() as tmp:
        configs = site_configs(tmp, "ab", rounds=ROUNDS)
        async with running(configs) as cluster:
            specs = _specs(configs, wide_site="b")
            t0 = time.monotonic()
            errs = await asyncio.gather(*(asyncio.to_thread(_open_and_wait, specs[s]) for s in "ab"))
            assert time.monotonic() - t0 < PROMPT_S + 5
            for site, err in zip("ab", errs, strict=True):
                _assert_mismatch_at_layer_1(err, site)
            for site, err in zip("ab", errs, strict=True):  # each hears which other site it differs from
                assert f"site {'b' if site == 'a' else 'a'}" in str(err), err
            for d in cluster.daemons.values():
                assert any(f["kind"] == "model" and f["fatal"] for f in d.status()["faults"])
            await cluster.stop_all()


@pytest.mark.timeout(60)
async def test_a_site_started_later_with_another_model_stops_the_waiting_site_too() -> None:
    with short_dir() as tmp:
        configs = site_configs(tmp, "ab", rounds=ROUNDS)
        async with running(configs) as cluster:
            specs = _specs(configs, wide_site="a")  # the *smaller* site is the odd one: order must not matter
            waiting = asyncio.create_task(asyncio.to_thread(_open_and_wait, specs["b"]))
            b = cluster.daemons["b"]
            await b.wait_for(lambda: b.status()["trainer"]["connected"])
            await cluster.daemons["a"].wait_for(lambda: cluster.daemons["a"].model.current is not None)
            late = await asyncio.to_thread(_open_and_wait, specs["a"])
            _assert_mismatch_at_layer_1(late, "a")  # refused in its handshake
            _assert_mismatch_at_layer_1(await waiting, "b")  # and b is told, not left waiting
            await cluster.stop_all()


@pytest.mark.timeout(60)
async def test_a_refused_gateway_link_reaches_the_trainer_as_a_warning() -> None:
    with short_dir() as tmp:
        configs = site_configs(tmp, "ab", rounds=ROUNDS)
        configs["a"] = dataclasses.replace(configs["a"], rounds=dataclasses.replace(ROUNDS, window=5))
        async with running(configs) as cluster:
            trainer = trainers_for(cluster, layers=2, iterations=2)["a"]  # a dials b and is refused
            await trainer.connect()
            await trainer.wait(lambda: bool(trainer.notices))
            notice = trainer.notices[0]
            assert notice.site == "b" and not notice.fatal and notice.kind == "config"
            assert "[gateway.rounds]" in notice.message
            assert not trainer.errors  # a warning: the trainer's connection stays up
            await trainer.close()
            await cluster.stop_all()


@pytest.mark.timeout(60)
async def test_a_trainer_with_a_wrong_secret_at_one_site_is_a_warning_at_the_others() -> None:
    from wanrt.client.config import ClientConfig
    from wanrt.client.link.api import LinkSpec
    from wanrt.client.link.gateway_link import open_gateway_link
    from wanrt.client.link.signature import LayerSignature
    from wanrt.errors import AuthError

    with short_dir() as tmp:
        configs = site_configs(tmp, "ab", rounds=ROUNDS)
        async with running(configs) as cluster:
            b = cluster.daemons["b"]
            await b.wait_for(lambda: b.status()["peers"]["a"]["state"] == "up")
            trainer = trainers_for(cluster, layers=2, iterations=2)["a"]
            await trainer.connect()
            sig = LayerSignature.of(["w0"], [(8, 8)], ["float32"])
            wrong = b"not-the-job-secret-at-all"
            spec = LinkSpec(configs["b"].trainer_listen, "b", JOB, wrong, sig, ClientConfig())
            with pytest.raises(AuthError):
                await asyncio.to_thread(open_gateway_link, spec)
            await trainer.wait(lambda: bool(trainer.notices))
            notice = trainer.notices[0]
            assert notice.site == "b" and notice.kind == "auth" and not notice.fatal
            assert "failed to authenticate" in notice.message and not trainer.errors
            await trainer.close()
            await cluster.stop_all()


@pytest.mark.timeout(60)
async def test_a_site_that_ran_rounds_alone_is_stopped_by_a_late_site_with_another_model() -> None:
    """Issue 21: site a started first and pushed (its gateway's model is then "established"); b's
    trainer came seconds later with one extra layer. b got ModelMismatch, a hung 120 s: b's fault was only
    a warning at a. b never took part in a round: the job is still starting for it, so the fault is fatal
    at a too."""
    from tools.harness.daemon_trainer import signature_info

    with short_dir() as tmp:
        configs = site_configs(tmp, "ab", rounds=ROUNDS)
        async with running(configs) as cluster:
            a = trainers_for(cluster, layers=2, iterations=3, info=signature_info(2))["a"]
            await a.connect()
            run_a = asyncio.create_task(a.run())
            gw_a = cluster.daemons["a"]
            await gw_a.wait_for(lambda: gw_a.model.established)  # a pushed: the job "runs" at a
            assert "b" not in gw_a.stats.contributed
            b = trainers_for(cluster, layers=3, iterations=3, info=signature_info(3))["b"]
            await b.connect()
            async with asyncio.timeout(PROMPT_S):
                await a.wait(lambda: any(n.kind == "model" and n.fatal for n in a.notices))
            assert any(n.site == "b" for n in a.notices if n.kind == "model")
            run_a.cancel()
            await asyncio.gather(run_a, return_exceptions=True)
            await a.close()
            await b.close()
            await cluster.stop_all()
