"""The demo's own convergence profile: keyed by the workload, cached, handed to the scheduler."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from scheduler.profile.config import ProfileConfig
from scheduler.profile.surrogate import ConvergenceProfile
from wanrt.demo.config import DEFAULT, QUICK, DemoConfig
from wanrt.demo.profile_cache import demo_profile_config, ensure_profile, profile_key


def _fake(calls: list[ProfileConfig]):  # type: ignore[no-untyped-def]
    """A cheap stand-in for Algorithm 1: a profile fitted to a few synthetic points over pcfg's range."""

    def compute(pcfg: ProfileConfig) -> ConvergenceProfile:
        calls.append(pcfg)
        rng = np.random.default_rng(0)
        r = 1 - 10 ** -rng.uniform(0, 3, 12)
        x = np.exp(rng.uniform(np.log(pcfg.min_total_batch), np.log(pcfg.max_total_batch), 12))
        return ConvergenceProfile.fit(
            r,
            x,
            0.1 * np.log2(x / pcfg.min_total_batch),
            r_range=(0.0, 0.999),
            batch_range=(float(pcfg.min_total_batch), float(pcfg.max_total_batch)),
            baseline_loss=0.5,
            baseline_batch=pcfg.middle_batch,
            probe={"hidden": pcfg.probe.hidden},
            restarts=0,
        )

    return compute


def test_the_probe_trains_the_demo_workload() -> None:
    p = demo_profile_config(DEFAULT)
    ranks = DEFAULT.sites * DEFAULT.ranks
    assert (p.probe.hidden, p.probe.lr, p.probe.seed) == (DEFAULT.model_hidden, DEFAULT.lr, DEFAULT.seed)
    assert p.min_total_batch <= ranks * DEFAULT.batch <= p.max_total_batch
    assert p.probe.samples % (ranks * DEFAULT.batch) == 0
    assert p.probe.measure == "samples_to_target" and p.probe.target_loss == DEFAULT.target_loss
    q = demo_profile_config(QUICK)
    assert q.probe.hidden == QUICK.model_hidden and q.max_total_batch <= QUICK.sites * QUICK.ranks * 256


@pytest.mark.parametrize(
    "change",
    [{"model_hidden": 256}, {"lr": 0.1}, {"batch": 64}, {"seed": 1}, {"sites": 2}, {"ranks": 1}],
)
def test_the_cache_key_changes_with_the_workload(change: dict[str, object]) -> None:
    key = profile_key(demo_profile_config(DEFAULT))
    assert profile_key(demo_profile_config(DEFAULT)) == key
    assert profile_key(demo_profile_config(dataclasses.replace(DEFAULT, **change))) != key  # type: ignore[arg-type]


def test_links_do_not_change_the_key() -> None:
    other = dataclasses.replace(DEFAULT, bandwidth_bps=1e9, rtt_s=0.01, fluctuating=False)
    assert profile_key(demo_profile_config(other)) == profile_key(demo_profile_config(DEFAULT))


def test_computed_once_then_read_from_the_cache(tmp_path: Path) -> None:
    calls: list[ProfileConfig] = []
    lines: list[str] = []
    first = ensure_profile(DEFAULT, directory=tmp_path, on_line=lines.append, compute=_fake(calls))
    assert not first.cached and len(calls) == 1 and first.path.is_file()
    assert any("profiling" in line for line in lines)
    assert [p.name for p in first.path.parent.iterdir()] == [first.path.name]  # no temp file left
    again = ensure_profile(DEFAULT, directory=tmp_path, on_line=lines.append, compute=_fake(calls))
    assert again.cached and again.path == first.path and again.seconds == 0.0 and len(calls) == 1
    other = ensure_profile(QUICK, directory=tmp_path, on_line=lines.append, compute=_fake(calls))
    assert not other.cached and other.path != first.path and len(calls) == 2


@pytest.mark.parametrize("content", ["{not json", '{"format": "something else"}', ""])
def test_a_corrupt_cache_file_is_recomputed_with_a_warning(tmp_path: Path, content: str) -> None:
    calls: list[ProfileConfig] = []
    first = ensure_profile(DEFAULT, directory=tmp_path, on_line=lambda _s: None, compute=_fake(calls))
    first.path.write_text(content)
    lines: list[str] = []
    again = ensure_profile(DEFAULT, directory=tmp_path, on_line=lines.append, compute=_fake(calls))
    assert not again.cached and len(calls) == 2
    assert any(line.startswith("warning:") and "recomputing" in line for line in lines)
    ConvergenceProfile.load(again.path)  # whole again


def test_the_demo_hands_its_cached_profile_to_the_scheduler(tmp_path: Path) -> None:
    from scheduler.daemon_config import load_scheduler_config
    from wanrt.demo.runner import Demo
    from wanrt.demo.sites.config_files import write_scheduler_files, write_secret

    cfg = DemoConfig(sites=2, ranks=1, auto_profile=True)
    made = ensure_profile(cfg, directory=tmp_path / "cache", on_line=lambda _s: None, compute=_fake([]))
    demo = Demo(cfg, tmp_path / "out", profile_cache=tmp_path / "cache", on_line=lambda _s: None)
    resolved = demo.with_profile(cfg)
    assert resolved.profile == str(made.path) and demo.profile is not None and demo.profile.cached
    sched = write_scheduler_files(
        resolved,
        job="j",
        run_dir=tmp_path / "run",
        sock_dir=tmp_path / "socks",
        secret_file=write_secret(tmp_path / "job.secret"),
    )
    assert load_scheduler_config(sched.config).profile == str(made.path)


def test_profile_none_and_a_given_file_are_left_alone(tmp_path: Path) -> None:
    from wanrt.demo.runner import Demo

    demo = Demo(DEFAULT, tmp_path / "out", profile_cache=tmp_path / "cache", on_line=lambda _s: None)
    off = dataclasses.replace(DEFAULT, auto_profile=False)
    assert demo.with_profile(DEFAULT).profile is None  # the default: the stand-in
    assert demo.with_profile(off).profile is None
    given = dataclasses.replace(DEFAULT, profile="/x/p.json", auto_profile=True)
    assert demo.with_profile(given).profile == "/x/p.json"
    assert demo.profile is None and not (tmp_path / "cache").exists()


def test_the_summary_line_gives_the_profile_cost_apart_from_the_time_to_target(tmp_path: Path) -> None:
    from wanrt.demo.cli import profile_line
    from wanrt.demo.profile_cache import CachedProfile

    made = CachedProfile(tmp_path / "p.json", cached=False, seconds=52.2, probes=32, key="k")
    line = profile_line(DEFAULT, made)
    assert "52.2 s (32 probes)" in line and "not counted in any time to target" in line
    assert "from the cache" in profile_line(DEFAULT, dataclasses.replace(made, cached=True, seconds=0.0))
    assert "stand-in" in profile_line(DEFAULT, None)
