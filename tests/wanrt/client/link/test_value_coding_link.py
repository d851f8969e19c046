"""Low-bit values through the real gateway link: negotiated at connect, summed exactly as sent."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tools.harness.fake_gateway import FakeGateway, run_in_thread
from wanrt.client.config import ClientConfig
from wanrt.client.leader.compression import LayerCompressor
from wanrt.client.link.api import LinkSpec, UpdateArrived
from wanrt.client.link.gateway_link import open_gateway_link
from wanrt.client.link.signature import LayerSignature
from wanrt.errors import UnsupportedValueCoding

SECRET = b"0123456789abcdef-test-secret"
SIG = LayerSignature.of(["w"], [(4000,)], ["float32"])


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[FakeGateway]:
    gw = FakeGateway(f"unix://{tmp_path}/gw.sock", sites=("a", "b"), job="j", secret=SECRET)
    with run_in_thread(gw):
        yield gw


def _spec(url: str, site: str, cfg: ClientConfig) -> LinkSpec:
    return LinkSpec(url, site, "j", SECRET, SIG, cfg)


def test_two_sites_sum_exactly_what_their_compressors_accounted_for(gateway: FakeGateway) -> None:
    cfgs = {
        "a": ClientConfig(density=0.05, wire_dtype="int2", connect_timeout_s=5.0, close_timeout_s=5.0),
        "b": ClientConfig(density=0.05, wire_dtype="int8", connect_timeout_s=5.0, close_timeout_s=5.0),
    }
    links = {s: open_gateway_link(_spec(gateway.url, s, c)) for s, c in cfgs.items()}
    rng = np.random.default_rng(0)
    expected = np.zeros(4000, np.float32)
    for site, cfg in cfgs.items():
        p = LayerCompressor(cfg).compress(0, rng.standard_normal(4000).astype(np.float32))
        expected += p.to_dense()
        links[site].push(0, 0, p)
    for link in links.values():
        ev = link.get(5.0)
        assert isinstance(ev, UpdateArrived)
        np.testing.assert_array_equal(ev.payload.to_dense(), expected)
    for link in links.values():
        link.close(5.0)
    assert gateway.errors == []


def test_a_gateway_without_low_bit_values_is_refused_at_connect(gateway: FakeGateway) -> None:
    gateway.value_codings = None  # a gateway that predates them: its Welcome offers none
    cfg = ClientConfig(wire_dtype="int4", connect_timeout_s=5.0, close_timeout_s=5.0)
    with pytest.raises(UnsupportedValueCoding, match="does not decode int4"):
        open_gateway_link(_spec(gateway.url, "a", cfg))
    fp16 = open_gateway_link(_spec(gateway.url, "b", cfg.with_changes(wire_dtype="fp16")))  # floats: fine
    fp16.close(5.0)
