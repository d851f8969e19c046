"""Scenario files: the packaged examples load, bad keys and values are ConfigErrors naming the key,
and the gateway's ``links`` option is validated."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateways.config import GatewayConfig
from sims.cli import packaged_scenarios
from sims.des.scenario import load_scenario
from wanrt.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "s.toml"
    p.write_text(text)
    return p


def test_packaged_scenarios_load() -> None:
    shipped = packaged_scenarios()
    assert {"four-sites", "straggler-seed002", "tree-1000"} <= set(shipped)
    for path in shipped.values():
        sc = load_scenario(path)
        assert sc.iterations >= 1
    assert load_scenario(shipped["tree-1000"]).sites == 1000


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[sim]\nsites = 0\n", "sim.sites"),
        ("[sim]\nbogus = 1\n", "sim.bogus"),
        ("[sim.network]\nloss = 1.5\n", "sim.network.loss"),
        ("[sim.network]\nrate_bps = 'fast'\n", "sim.network.rate_bps"),
        ("[sim.payload]\ndensity = 0\n", "sim.payload.density"),
        ("[sim.compute]\nmodel = 'trace'\n", "sim.compute.trace"),
        ("[sim.compute.slow]\nzz = 2.0\n", "sim.compute.slow.zz"),
        ("[[sim.links]]\na = 's000'\nb = 'nope'\n", "sim.links[0].b"),
        ("[sim.gateway]\nlinks = 'some'\n", "sim.gateway.links"),
        ("[sim.gateway.rounds]\ntopology = 'mesh'\n", "sim.gateway.rounds.topology"),
        ("[sim]\nsites = 1500\n", "sim.sites"),
        ("[sim]\nsites = 20000\n", "sim.sites"),
        ("[sim.network]\ntrace = 'missing.csv'\n", "sim.network.trace"),
        ("[other]\nx = 1\n", "other"),
    ],
)
def test_bad_scenarios_name_the_key(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_scenario(write(tmp_path, text))
    assert info.value.fields.get("key") == key


def test_trace_path_is_relative_to_the_scenario(tmp_path: Path) -> None:
    (tmp_path / "bw.csv").write_text("t,bps\n0,10M\n1,20M\n")
    sc = load_scenario(write(tmp_path, "[sim.network]\ntrace = 'bw.csv'\n"))
    assert sc.network.trace == str(tmp_path / "bw.csv")


def test_gateway_links_option_is_checked() -> None:
    with pytest.raises(ConfigError) as info:
        GatewayConfig(site="a", job="j", secret="s" * 16, links="some")  # type: ignore[arg-type]
    assert info.value.fields.get("key") == "links"
    assert GatewayConfig(site="a", job="j", secret="s" * 16).links == "all"
