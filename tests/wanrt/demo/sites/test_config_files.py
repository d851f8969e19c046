"""The per-run gateway configs the demo writes are valid gateway configs with the links it promises."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from gateways.config import load_gateway_config
from tools.harness.relative_demo_files import write_relative_demo_run
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


def test_a_run_with_the_scheduler_writes_a_scheduler_config_its_loader_accepts(tmp_path: Path) -> None:
    from scheduler.daemon_config import load_scheduler_config
    from wanrt.demo.sites.config_files import write_scheduler_files

    cfg = DemoConfig(sites=3, decide_interval_s=0.4, telemetry_interval_s=0.2, announce_margin=6)
    secret = write_secret(tmp_path / "job.secret")
    sched = write_scheduler_files(
        cfg,
        job="j2",
        run_dir=tmp_path / "run",
        sock_dir=tmp_path / "socks",
        secret_file=secret,
        control={"bytes_per_element": 4.0625, "warmup_iterations": 30},
    )
    sc = load_scheduler_config(sched.config)
    assert sc.job == "j2" and sc.sites == ("a", "b", "c") and sc.policy == "adaptive"
    assert sc.listen == sched.listen_url and sc.decide_interval_s == 0.4 and sc.announce_margin == 6
    assert sc.control.bytes_per_element == 4.0625 and sc.control.warmup_iterations == 30
    assert sc.profile is None
    files = write_run_files(
        cfg,
        job="j2",
        run_dir=tmp_path / "run",
        sock_dir=tmp_path / "socks",
        secret_file=secret,
        trace_file=None,
        scheduler_url=sched.listen_url,
    )
    for f in files:
        gw = load_gateway_config(f.config)
        assert gw.scheduler == sched.listen_url and gw.telemetry_interval_s == 0.2


def test_the_trace_a_run_saw_starts_where_the_gateway_had_got_to(tmp_path: Path) -> None:
    from wanrt.demo.sites.config_files import trace_in_run

    trace = BandwidthTrace.from_pairs([(0.0, 100e6), (2.0, 30e6), (4.0, 60e6)], period=6.0)
    # the gateway had played it for 3 s when the run started: 30 Mbit/s until 4 s (1 s into the run), ...
    assert trace_in_run(trace, 3.0, 8.0) == [(0.0, 30e6), (1.0, 60e6), (3.0, 100e6), (5.0, 30e6), (7.0, 60e6)]
    assert trace_in_run(trace, 0.0, 1.5) == [(0.0, 100e6)]
    once = BandwidthTrace.from_pairs([(0.0, 100e6), (5.0, 30e6)])
    assert trace_in_run(once, 1.0, 100.0) == [(0.0, 100e6), (4.0, 30e6)]


def test_relative_paths_are_written_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 21: `wanrt demo --out demo-out` failed with "trace file not found:
    .../demo-out/dense/demo-out/dense/fluctuating-site.csv": a relative path written into a TOML is read
    relative to that TOML's directory."""
    monkeypatch.chdir(tmp_path)
    files = write_relative_demo_run()
    for f in files:
        gw = load_gateway_config(f.config)  # the trace file is found
        traces = [s.trace for s in gw.shaping.values() if s.trace is not None]
        assert traces == [str(tmp_path / "demo-out" / "dense" / "fluctuating-site.csv")]
        assert gw.credentials().for_trainer()  # and the secret
