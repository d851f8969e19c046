"""The real gateway link (thread + asyncio + protocol) against the fake gateway over unix sockets."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tools.harness.fake_gateway import FakeGateway, run_in_thread
from wanrt.client.config import ClientConfig
from wanrt.client.errors import GatewayUnreachable, ModelMismatch
from wanrt.client.link.api import LinkSpec, UpdateArrived
from wanrt.client.link.gateway_link import GatewayLink, open_gateway_link
from wanrt.client.link.signature import LayerSignature
from wanrt.client.site.decision import ConfigChange
from wanrt.errors import AuthError
from wanrt.payload import SparsePayload

SECRET = b"0123456789abcdef-test-secret"
SIG = LayerSignature.of(["w", "b"], [(40,), (8,)], ["float32", "float32"])
CFG = ClientConfig(connect_timeout_s=5.0, close_timeout_s=5.0)


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[FakeGateway, asyncio.AbstractEventLoop]]:
    gw = FakeGateway(f"unix://{tmp_path}/gw.sock", sites=("a", "b"), job="j", secret=SECRET)
    with run_in_thread(gw) as loop:
        yield gw, loop


def spec(
    url: str, site: str, *, secret: bytes = SECRET, sig: LayerSignature = SIG, **cfg: object
) -> LinkSpec:
    return LinkSpec(url, site, "j", secret, sig, CFG.with_changes(**cfg) if cfg else CFG)


def payload(layer: int, dense_len: int, blocks: list[int], scale: float) -> SparsePayload:
    dense = np.arange(dense_len, dtype=np.float32) * np.float32(scale)
    return SparsePayload.from_dense_blocks(layer, dense, np.array(blocks, dtype=np.int64), 16)


def wait_event(link: GatewayLink) -> UpdateArrived | ConfigChange:
    ev = link.get(5.0)
    assert ev is not None, "no event within 5 s"
    return ev


def test_two_sites_get_the_exact_sum_and_close_cleanly(
    gateway: tuple[FakeGateway, asyncio.AbstractEventLoop],
) -> None:
    gw, _ = gateway
    a, b = open_gateway_link(spec(gw.url, "a")), open_gateway_link(spec(gw.url, "b", wire_dtype="fp16"))
    a.push(0, 0, payload(0, 40, [0, 2], 1.0))
    b.push(0, 0, payload(0, 40, [1, 2], 0.5))
    for link in (a, b):
        ev = wait_event(link)
        assert isinstance(ev, UpdateArrived) and (ev.iteration, ev.layer, ev.sites) == (0, 0, ("a", "b"))
        expected = payload(0, 40, [0, 2], 1.0).to_dense() + payload(0, 40, [1, 2], 0.5).to_dense()
        np.testing.assert_array_equal(ev.payload.to_dense(), expected)  # fp16 is exact for these values
    a.close(5.0)
    b.close(5.0)
    assert gw.errors == []


def test_config_update_reaches_the_trainer(gateway: tuple[FakeGateway, asyncio.AbstractEventLoop]) -> None:
    gw, loop = gateway
    a = open_gateway_link(spec(gw.url, "a"))
    asyncio.run_coroutine_threadsafe(gw.wait_for_sites("a"), loop).result(5)
    asyncio.run_coroutine_threadsafe(
        gw.announce({"density": 0.05, "batch_size": 48, "other": "x"}, 7), loop
    ).result(5)
    assert wait_event(a) == ConfigChange(7, density=0.05, batch_size=48, staleness=None)
    a.close(5.0)


def test_unreachable_gateway_names_the_url(tmp_path: Path) -> None:
    url = f"unix://{tmp_path}/nobody.sock"
    with pytest.raises(GatewayUnreachable) as info:
        open_gateway_link(spec(url, "a"))
    assert url in str(info.value) and "wanrt gateway" in str(info.value)


def test_wrong_secret_is_an_auth_error(gateway: tuple[FakeGateway, asyncio.AbstractEventLoop]) -> None:
    gw, _ = gateway
    with pytest.raises(AuthError, match="does not share this job's secret"):
        open_gateway_link(spec(gw.url, "a", secret=b"another-secret-of-16+bytes"))


def test_model_differing_between_sites_names_the_first_layer(
    gateway: tuple[FakeGateway, asyncio.AbstractEventLoop],
) -> None:
    gw, _ = gateway
    a = open_gateway_link(spec(gw.url, "a"))
    other = LayerSignature.of(["w", "b"], [(40,), (9,)], ["float32", "float32"])
    with pytest.raises(ModelMismatch) as info:
        open_gateway_link(spec(gw.url, "b", sig=other))
    assert "layer 1 'b' shape (9,)" in str(info.value) and "trained by site a" in str(info.value)
    a.close(5.0)
