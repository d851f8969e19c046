"""ConvergenceProfile: JSON round trip gives the same ḡ; a malformed file is a ConfigError with the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from scheduler.control.convergence import ConvergenceModel
from scheduler.profile.surrogate import MAX_FILE_BYTES, ConvergenceProfile
from wanrt.errors import ConfigError


def _truth(r: np.ndarray, x: np.ndarray) -> np.ndarray:
    u = -np.log10(1 - r)
    return 0.15 * u**2 + 0.4 * np.log2(x / 32.0)


@pytest.fixture(scope="module")
def profile() -> ConvergenceProfile:
    rng = np.random.default_rng(0)
    r = 1 - 10 ** -rng.uniform(0, 3, 25)
    x = 2 ** rng.uniform(3, 9, 25)
    return ConvergenceProfile.fit(
        r,
        x,
        _truth(r, x),
        r_range=(0.0, 0.999),
        batch_range=(8.0, 512.0),
        baseline_loss=0.5,
        baseline_batch=260,
        staleness=0.03,
        probe={"model": "synthetic"},
        restarts=1,
    )


def test_fit_approximates_a_smooth_truth(profile: ConvergenceProfile) -> None:
    r = np.array([0.0, 0.9, 0.99, 0.995])
    x = np.array([16.0, 64.0, 100.0, 300.0])
    got, _ = profile.predict_log_ratio(r, x)
    assert np.abs(got - _truth(r, x)).max() < 0.15
    assert isinstance(profile, ConvergenceModel)
    assert profile.staleness_penalty == 0.03 and profile.total_batch_range == (8.0, 512.0)
    assert np.all(profile.penalty(r, x) > -1)


def test_json_round_trip_rebuilds_identical_predictions(profile: ConvergenceProfile, tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    profile.save(path)
    doc = json.loads(path.read_text())
    assert doc["format"] == "wanrt-convergence-profile" and len(doc["points"]) == 25
    assert set(doc["kernel"]) >= {"constant", "length_scales", "noise"}
    loaded = ConvergenceProfile.load(path)
    grid_r, grid_x = np.meshgrid(np.linspace(0, 0.999, 9), np.geomspace(8, 512, 7))
    assert np.allclose(loaded.penalty(grid_r, grid_x), profile.penalty(grid_r, grid_x), rtol=1e-9, atol=1e-12)
    m1, s1 = loaded.predict_log_ratio(grid_r, grid_x)
    _, s0 = profile.predict_log_ratio(grid_r, grid_x)
    assert np.allclose(s1, s0, atol=1e-9) and m1.shape == grid_r.shape
    assert loaded.staleness_penalty == 0.03 and loaded.probe == {"model": "synthetic"}


def test_inputs_are_clipped_to_the_profiled_domain(profile: ConvergenceProfile) -> None:
    assert float(profile.penalty(0.9999, 10_000)) == pytest.approx(float(profile.penalty(0.999, 512)))


def _mutate(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    d = json.loads(json.dumps(doc))
    cur: Any = d
    keys = path.split(".")
    for k in keys[:-1]:
        cur = cur[int(k)] if k.isdigit() else cur[k]
    last = keys[-1]
    if value is _DELETE:
        del cur[last]
    elif last.isdigit():
        cur[int(last)] = value
    else:
        cur[last] = value
    return d


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "key"),
    [
        ("format", "pickle", "profile.format"),
        ("version", 99, "profile.version"),
        ("points", [], "profile.points"),
        ("points.0.r", "high", "profile.points[0].r"),
        ("points.3.r", 0.9999, "profile.points[3].r"),
        ("points.2.total_batch", -4, "profile.points[2].total_batch"),
        ("points.1.log_ratio", _DELETE, "profile.points[1].log_ratio"),
        ("kernel.noise", 0, "profile.kernel.noise"),
        ("kernel.length_scales", [0.1], "profile.kernel.length_scales"),
        ("kernel.kind", "rbf", "profile.kernel.kind"),
        ("domain.r", [0.5, 0.1], "profile.domain.r"),
        ("baseline.loss", -1.0, "profile.baseline.loss"),
        ("baseline.total_batch", 1.5, "profile.baseline.total_batch"),
        ("staleness_penalty", "x", "profile.staleness_penalty"),
    ],
)
def test_validation_names_the_bad_field(
    profile: ConvergenceProfile, tmp_path: Path, path: str, value: Any, key: str
) -> None:
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(_mutate(profile.to_json(), path, value)))
    with pytest.raises(ConfigError) as info:
        ConvergenceProfile.load(p)
    assert info.value.fields["key"] == key
    assert info.value.fields["path"] == str(p)


def test_unreadable_files_are_config_errors(profile: ConvergenceProfile, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        ConvergenceProfile.load(tmp_path / "missing.json")
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        ConvergenceProfile.load(tmp_path / "junk.json")
    nan = json.dumps(profile.to_json()).replace('"noise": ', '"noise": NaN, "x": ', 1)
    (tmp_path / "nan.json").write_text(nan)
    with pytest.raises(ConfigError, match="not valid JSON"):
        ConvergenceProfile.load(tmp_path / "nan.json")
    (tmp_path / "big.json").write_bytes(b" " * (MAX_FILE_BYTES + 1))
    with pytest.raises(ConfigError, match="limit"):
        ConvergenceProfile.load(tmp_path / "big.json")
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(ConfigError) as info:
        ConvergenceProfile.load(tmp_path / "list.json")
    assert info.value.fields["key"] == "profile.profile"
