from dataclasses import dataclass, field
from typing import Literal

import pytest

from wanrt.config import check, from_mapping, load_toml
from wanrt.errors import ConfigError


@dataclass(frozen=True)
class Inner:
    alpha: float = 0.3
    streak: int = 3

    def __post_init__(self) -> None:
        check(0 < self.alpha < 1, "alpha", self.alpha, "must be in (0, 1)")


@dataclass(frozen=True)
class Outer:
    name: str
    mode: Literal["star", "ring"] = "star"
    peers: tuple[str, ...] = ()
    inner: Inner = field(default_factory=Inner)


def test_builds_nested_frozen_config() -> None:
    cfg = from_mapping(Outer, {"name": "a", "peers": ["x", "y"], "inner": {"alpha": 0.5}})
    assert cfg == Outer("a", "star", ("x", "y"), Inner(0.5, 3))


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"name": "a", "bogus": 1}, "bogus"),
        ({"name": 3}, "name"),
        ({"name": "a", "mode": "tree"}, "mode"),
        ({"name": "a", "inner": {"streak": "3"}}, "gw.inner.streak"),
        ({"name": "a", "inner": {"alpha": 2.0}}, "gw.inner.alpha"),
        ({}, "gw.name"),
    ],
)
def test_errors_name_the_key(data: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_mapping(Outer, data, section="gw")
    assert info.value.key.endswith(key)


def test_load_toml_errors(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError):
        load_toml(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("x = [")
    with pytest.raises(ConfigError):
        load_toml(bad)


@dataclass(frozen=True)
class WithOptional:
    inner: Inner | None = None


def test_optional_table_errors_keep_the_inner_key() -> None:
    with pytest.raises(ConfigError) as info:
        from_mapping(WithOptional, {"inner": {"alpha": 5.0}}, section="gw")
    assert info.value.key == "gw.inner.alpha"
    assert from_mapping(WithOptional, {}).inner is None
