"""The public client link (wanrt.client.link.gateway_link) against a real gateway that dies and is started
again: the link finds it again by itself, sends every push it never saw acknowledged, answers the rounds the
restarted gateway will never send, drops the results a reconnect brings twice, and in the end every push of
both sites is counted exactly once (the chaos soak's trainer does this by hand: tools/chaos_trainer.py)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

import numpy as np
import pytest

from gateways.rounds.config import RoundConfig
from tools.harness.daemon_cluster import JOB, SECRET, add_held, dense_sum, running, short_dir, site_configs
from tools.harness.daemon_trainer import FakeTrainer
from tools.harness.exact_payloads import layer_shape, make_payload
from wanrt.client.config import ClientConfig
from wanrt.client.link.api import LinkSpec, UpdateArrived
from wanrt.client.link.gateway_link import GatewayLink, open_gateway_link
from wanrt.client.link.reconnect import ReconnectPolicy
from wanrt.client.link.signature import LayerSignature
from wanrt.protocol.peer.round_msg import ContribId

ITERATIONS = 40
LAYERS = 3
K = 12  # d's gateway dies once d pushed this far
STALENESS = 1
SIG = LayerSignature.of(
    [f"layer{i}.weight" for i in range(LAYERS)],
    [(layer_shape(i)[0],) for i in range(LAYERS)],
    ["float32"] * LAYERS,
)


@pytest.fixture(autouse=True)
def _numpy_codec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANRT_KERNELS", "numpy")


class Driver:
    """Site d's training loop in a thread, as the client runs it: push every layer of an iteration, wait
    for the updates ``STALENESS`` back; each update must come exactly once."""

    def __init__(self, link: GatewayLink) -> None:
        self.link = link
        self.got: Counter[tuple[int, int]] = Counter()
        self.events: Counter[str] = Counter()
        self.pushed_through = -1
        self.allow = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="site-d-driver", daemon=True)

    def _take(self, until: float) -> None:
        ev = self.link.get(max(0.01, until - time.monotonic()))
        if ev is None:
            missing = sorted(
                (it, layer)
                for it in range(self.pushed_through + 1)
                for layer in range(LAYERS)
                if (it, layer) not in self.got
            )
            raise TimeoutError(
                f"no update within the test's deadline; pushed through {self.pushed_through}, missing "
                f"{missing[:8]}, events {dict(self.events)}, reconnects {self.link.reconnects}"
            )
        self.events[type(ev).__name__] += 1
        if isinstance(ev, UpdateArrived):
            self.got[(ev.iteration, ev.layer)] += 1

    def _wait_for(self, iteration: int, until: float) -> None:
        while any((iteration, layer) not in self.got for layer in range(LAYERS)):
            self._take(until)

    def _run(self) -> None:
        until = time.monotonic() + 40
        try:
            for n in range(ITERATIONS):
                if n == K:
                    self.allow.wait(60)
                if n - 1 - STALENESS >= 0:
                    self._wait_for(n - 1 - STALENESS, until)
                for layer in reversed(range(LAYERS)):
                    self.link.push(n, layer, make_payload("d", n, layer))
                self.pushed_through = n
            for n in range(ITERATIONS):
                self._wait_for(n, until)
        except BaseException as exc:
            self.error = exc


@pytest.mark.timeout(150)
async def test_the_client_link_reconnects_to_a_restarted_gateway_and_loses_nothing() -> None:
    # tree a -> (b, c), b -> d (as tests/gateways/service/test_restart.py): d, whose trainer is the client
    # link, is a leaf; the others keep completing rounds while its gateway is down
    rounds = RoundConfig(topology="tree", round_deadline_s=5.0, suspect_after_s=5.0)
    with short_dir() as tmp:
        async with running(site_configs(tmp, "abcd", rounds=rounds)) as cluster:
            others = {
                s: FakeTrainer(
                    cluster.configs[s].trainer_listen,
                    s,
                    JOB,
                    SECRET.encode(),
                    layers=LAYERS,
                    iterations=ITERATIONS,
                    info=SIG.info(),
                )
                for s in "abc"
            }
            for t in others.values():
                t.allow_until(K + 8)  # the job moves past d while its gateway is down, not to the end
                await t.connect()
            runs = [asyncio.create_task(t.run()) for t in others.values()]
            spec = LinkSpec(
                cluster.configs["d"].trainer_listen,
                "d",
                JOB,
                SECRET.encode(),
                SIG,
                ClientConfig(connect_timeout_s=5.0, close_timeout_s=5.0),
                reconnect=ReconnectPolicy(initial_s=0.05, max_s=0.5, give_up_s=60.0),
            )
            link = await asyncio.to_thread(open_gateway_link, spec)
            driver = Driver(link)
            driver.thread.start()
            try:
                async with asyncio.timeout(120):
                    while driver.pushed_through < K - 1 and driver.error is None:
                        await asyncio.sleep(0.02)
                    await asyncio.sleep(0.2)  # d's last pushes in flight or held at its gateway
                    await cluster.kill("d")
                    driver.allow.set()  # d keeps pushing into the outage: held, sent again later
                    a = others["a"]
                    await a.wait(lambda: (K + 6, 0) in a.aggregates)  # the others went on without d
                    new_d = await cluster.start("d")
                    await new_d.wait_joined()
                    for t in others.values():
                        t.allow_until(None)
                    await asyncio.to_thread(driver.thread.join, 100)
                    assert driver.error is None, repr(driver.error)
                    await asyncio.gather(*runs)
                    for t in others.values():
                        await t.wait_all(ITERATIONS)
                    # every push of d counted (a counted push is acknowledged, a folded one with its carrier)
                    while len(link._unacked) and link._error is None:
                        await asyncio.sleep(0.05)
                    for t in others.values():
                        await t.wait(lambda t=t: not t.unacked)  # type: ignore[misc]
            finally:
                driver.allow.set()
                await asyncio.to_thread(link.close, 5.0)
                for t in others.values():
                    await t.close()
            await cluster.stop_all()

    assert link.reconnects >= 1 and link.resent >= 1
    # every (iteration, layer) d pushed was answered exactly once: duplicates a reconnect brought were dropped
    assert set(driver.got) == {(it, layer) for it in range(ITERATIONS) for layer in range(LAYERS)}
    assert max(driver.got.values()) == 1
    assert driver.events["ResyncStarted"] == 1  # the job moved on while d was down
    # every push of every site counted exactly once in the results a delivered
    finals = cluster.delivered("a")
    for layer in range(LAYERS):
        seen: Counter[ContribId] = Counter()
        got = np.zeros(layer_shape(layer)[0], np.float32)
        for (_, lay), d in finals.items():
            if lay == layer:
                assert d.payload is not None
                d.payload.add_into(got)
                seen.update(d.sites)
        add_held(cluster, "abcd", layer, got, seen)  # what is still held anywhere
        assert all(n == 1 for n in seen.values()), f"layer {layer}: counted twice: {seen.most_common(3)}"
        pushes = [make_payload(s, it, layer) for s in "abcd" for it in range(ITERATIONS)]
        np.testing.assert_array_equal(
            got, dense_sum(pushes, layer), err_msg=f"layer {layer}: lost or doubled"
        )
