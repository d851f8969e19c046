"""The gateways' configs on namespaces: WAN over TCP to each peer's address on their link, no user-space
shaping, the trainer socket untouched, and still a valid gateway config. No root needed (nothing is
built)."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from gateways.config import load_gateway_config
from sims.netns.topology import Topology
from wanrt.demo.config import DEFAULT
from wanrt.demo.ddp_worker import WorkerSpec
from wanrt.demo.netns_sites import GATEWAY_PORT, NetnsSites, on_netns
from wanrt.demo.sites.config_files import write_run_files, write_secret


@pytest.mark.parametrize("topology", ["mesh", "bridge"])
def test_run_files_are_rewritten_for_tcp_over_the_veths(tmp_path: Path, topology: Topology) -> None:
    cfg = on_netns(DEFAULT)
    trace = tmp_path / "trace.csv"
    trace.write_text("0,1e8\n")
    files = write_run_files(
        cfg,
        job="j",
        run_dir=tmp_path / "run",
        sock_dir=tmp_path / "s",
        secret_file=write_secret(tmp_path / "secret"),
        trace_file=trace,
    )
    before = {f.site: tomllib.loads(f.config.read_text())["gateway"] for f in files}
    assert all("shaping" in g for g in before.values())
    net = NetnsSites(3, 100e6, topology=topology)
    net.adapt_run_files(files)
    for i, f in enumerate(files):
        doc = tomllib.loads(f.config.read_text())
        gw = doc["gateway"]
        assert gw["listen"] == f"tcp://0.0.0.0:{GATEWAY_PORT}"
        assert gw["trainer_listen"] == before[f.site]["trainer_listen"] == f.trainer_url
        assert "shaping" not in gw
        others = [(j, g.site) for j, g in enumerate(files) if j != i]
        assert gw["peers"] == {s: f"tcp://{net.emu.address(j, i)}:{GATEWAY_PORT}" for j, s in others}
        if topology == "bridge":  # one address per site
            assert gw["peers"] == {s: f"tcp://10.213.0.{j + 1}:{GATEWAY_PORT}" for j, s in others}
        assert gw["rounds"] == before[f.site]["rounds"]
        assert load_gateway_config(f.config).listen == gw["listen"]  # still a valid config


def test_on_netns_drops_what_the_links_cannot_do() -> None:
    moved = on_netns(DEFAULT)
    assert (moved.rtt_s, moved.jitter_s, moved.fluctuating) == (0.0, 0.0, False)
    assert (
        dataclasses.replace(moved, rtt_s=DEFAULT.rtt_s, jitter_s=DEFAULT.jitter_s, fluctuating=True)
        == DEFAULT
    )


def test_worker_spec_round_trips_through_json() -> None:
    spec = WorkerSpec(
        rank=3, world=6, site_index=1, local_rank=1, store="/tmp/s", data="/tmp/d.npz", hidden=8, seed=1,
        batch=32, lr=0.3, optimizer="sgd", eval_every=5, target_loss=0.1, max_iters=10, evaluator=False,
        ifname="wan0",
    )  # fmt: skip
    assert WorkerSpec.from_json(spec.to_json()) == spec
