"""The per-run gateway configs the demo writes are valid gateway configs with the links it promises."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from gateways.config import load_gateway_config
from transports.traces import BandwidthTrace
from wanrt.demo.config import DemoConfig
from wanrt.demo.sites.config_files import fluctuating_trace, toml_text, write_run_files, write_secret


def test_configs_load_with_the_gateway_loader_and_shape_every_link(tmp_path: Path) -> None:
    cfg = DemoConfig(sites=3, bandwidth_bps=50e6, rtt_s=0.06, topology="ring")
    secret = write_secret(tmp_path / "job.secret")
    assert secret.stat().st_mode & 0o077 == 0  # the job secret is private to its owner
    trace = tmp_path / "trace.csv"
    fluctuating_trace(cfg).save(trace)
    files = write_run_files(
        cfg,
        job="j1",
        run_dir=tmp_path / "run",
        sock_dir=tmp_path / "socks",
        secret_file=secret,
        trace_file=trace,
    )
    assert [f.site for f in files] == ["a", "b", "c"]
    listen = {f.site: f.listen_url for f in files}
    for f in files:
        gw = load_gateway_config(f.config)
        assert gw.site == f.site and gw.job == "j1"
        assert gw.trainer_listen == f.trainer_url and f.trainer_url.startswith("unix:///tmp/")
        assert dict(gw.peers) == {s: u for s, u in listen.items() if s != f.site}
        assert gw.rounds.topology == "ring"
        assert gw.rounds.round_deadline_s == cfg.round_deadline_s
        for peer, shape in gw.shaping.items():
            assert shape.rate_bps == 50e6
            assert shape.delay_s == pytest.approx(0.03)  # one way = RTT / 2
            touches_c = "c" in (f.site, peer)
            assert (shape.trace is not None) == touches_c, (f.site, peer)


def test_without_a_trace_no_link_fluctuates(tmp_path: Path) -> None:
    files = write_run_files(
        DemoConfig(sites=2),
        job="j",
        run_dir=tmp_path,
        sock_dir=tmp_path / "socks",
        secret_file=write_secret(tmp_path / "s"),
        trace_file=None,
    )
    for f in files:
        assert all(s.trace is None for s in load_gateway_config(f.config).shaping.values())


def test_a_socket_path_that_cannot_fit_sun_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="too long"):
        write_run_files(
            DemoConfig(sites=2),
            job="j",
            run_dir=tmp_path,
            sock_dir=Path("/tmp") / ("x" * 120),
            secret_file=tmp_path / "s",
            trace_file=None,
        )


def test_the_trace_stays_between_floor_and_nominal_rate_and_repeats(tmp_path: Path) -> None:
    cfg = DemoConfig(bandwidth_bps=100e6, trace_floor=0.25, seed=3)
    trace = fluctuating_trace(cfg)
    rates = [r for _, r in trace.steps]
    assert rates[0] == 100e6
    assert min(rates) >= 25e6 - 1 and max(rates) <= 100e6
    assert len(set(rates)) > len(rates) // 2  # it really moves
    assert trace.period is not None and trace.rate_at(trace.period + 0.1) == rates[0]
    assert fluctuating_trace(cfg) == trace  # reproducible by seed
    p = tmp_path / "t.csv"
    trace.save(p)
    loaded = BandwidthTrace.load(p)
    assert [r for _, r in loaded.steps] == pytest.approx(rates)


def test_toml_text_round_trips_through_tomllib() -> None:
    tables = {"x": {"s": 'a "quoted" \\ path', "f": 1.5e-3, "i": 7, "b": True}, "x.y": {"inf": float("inf")}}
    assert tomllib.loads(toml_text(tables)) == {
        "x": {"s": 'a "quoted" \\ path', "f": 1.5e-3, "i": 7, "b": True, "y": {"inf": float("inf")}}
    }
