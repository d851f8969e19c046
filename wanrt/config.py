"""Frozen configuration dataclasses loaded from TOML, validated on load with errors that name the bad key.

Every component (gateway, transports, kernels, client, demo) declares its settings as a frozen dataclass
with defaults; :func:`from_mapping` builds one from a TOML table and rejects unknown keys, wrong types and
out-of-range values with a :class:`~wanrt.errors.ConfigError` whose ``key`` is the dotted path of the
offending setting (``gateway.rates.alpha``), so an operator never has to guess which line is wrong.

Range checks live in each dataclass's ``__post_init__``, raising ``ConfigError(key=<field name>)``; the
loader prefixes the section path.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from wanrt.errors import ConfigError

__all__ = ["check", "from_mapping", "load_toml"]

T = TypeVar("T")


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file; a missing file or a syntax error becomes a :class:`ConfigError`."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {p}", path=str(p)) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {p} is not valid TOML: {exc}", path=str(p)) from None


def check(ok: bool, key: str, value: Any, why: str) -> None:
    """Raise ``ConfigError(key=...)`` unless ``ok``; for use in ``__post_init__`` range checks."""
    if not ok:
        raise ConfigError(f"invalid value for {key!r}: {value!r} ({why})", key=key, value=value)


def _coerce(tp: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        candidates = [a for a in args if a is not type(None)]
        if len(candidates) == 1:
            # `X | None`: the inner error names the precise key (e.g. gateway.tls.cafile); keep it.
            return _coerce(candidates[0], value, key)
        for arg in candidates:
            try:
                return _coerce(arg, value, key)
            except ConfigError:
                continue
        raise ConfigError(f"{key!r}: {value!r} does not match {tp}", key=key, value=value)
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{key!r} must be one of {list(args)}, got {value!r}", key=key, value=value)
        return value
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key!r} must be a table, got {type(value).__name__}", key=key, value=value)
        return from_mapping(tp, value, section=key)
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key!r} must be a list, got {type(value).__name__}", key=key, value=value)
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(args[0], v, f"{key}[{i}]") for i, v in enumerate(value))
        if origin is tuple and args:
            if len(args) != len(value):
                raise ConfigError(f"{key!r} must have {len(args)} items", key=key, value=value)
            return tuple(
                _coerce(a, v, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True))
            )
        inner = args[0] if args else Any
        return tuple(_coerce(inner, v, f"{key}[{i}]") for i, v in enumerate(value))
    if origin in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key!r} must be a table", key=key, value=value)
        kt, vt = args if args else (Any, Any)
        return {_coerce(kt, k, key): _coerce(vt, v, f"{key}.{k}") for k, v in value.items()}
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key!r} must be a number, got {value!r}", key=key, value=value)
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key!r} must be an integer, got {value!r}", key=key, value=value)
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key!r} must be true or false, got {value!r}", key=key, value=value)
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key!r} must be a string, got {value!r}", key=key, value=value)
        return value
    if isinstance(tp, type):
        if not isinstance(value, tp):
            raise ConfigError(f"{key!r} must be {tp.__name__}, got {value!r}", key=key, value=value)
        return value
    return value


def from_mapping(cls: type[T], data: Mapping[str, Any], *, section: str = "") -> T:
    """Build the frozen dataclass ``cls`` from a TOML table, validating keys, types and ranges."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    if not isinstance(data, Mapping):
        raise ConfigError(f"section {section or '<root>'!r} must be a table", key=section or None)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    prefix = f"{section}." if section else ""
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            f"unknown key {prefix}{unknown[0]!r}; known keys: {', '.join(sorted(fields))}",
            key=prefix + unknown[0],
        )
    kwargs = {name: _coerce(hints[name], data[name], prefix + name) for name in fields if name in data}
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        if exc.fields.get("key") and prefix and not str(exc.fields["key"]).startswith(prefix):
            key = prefix + str(exc.fields["key"])
            raise ConfigError(
                exc.message.replace(repr(exc.fields["key"]), repr(key)),
                key=key,
                value=exc.fields.get("value"),
            ) from None
        raise
    except TypeError as exc:
        missing = [
            n
            for n, f in fields.items()
            if n not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        if missing:
            raise ConfigError(
                f"missing required key {prefix}{missing[0]!r}", key=prefix + missing[0]
            ) from None
        raise ConfigError(f"section {section or '<root>'!r}: {exc}", key=section or None) from None
