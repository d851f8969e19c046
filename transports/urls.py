"""Transport URLs: ``tcp://host:port``, ``unix:///path``, ``mem://name``, with optional link shaping.

A gateway config names its links by URL, so emulating a WAN link for the demo is a config change, not a
code change: a query string shapes the *outgoing* direction of the connections made (``connect``) or
accepted (``listen``) through that URL, e.g. ``tcp://127.0.0.1:9000?rate=100M&delay=20ms&jitter=2ms``.

Query keys: ``rate`` (bit/s; SI suffixes k/M/G, ``inf``), ``delay`` and ``jitter`` (seconds, or with an
``ms``/``us``/``s`` suffix), ``burst``, ``chunk``, ``queue`` (bytes; suffixes KiB/MiB/k/M). Anything
malformed is a :class:`~wanrt.errors.ConfigError` naming the URL part.
"""

from __future__ import annotations

import contextlib
import math
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qsl, urlsplit

from transports.link import LinkShape
from wanrt.errors import ConfigError

__all__ = [
    "MAX_UNIX_PATH_BYTES",
    "Endpoint",
    "parse_bytes",
    "parse_duration",
    "parse_rate",
    "parse_url",
    "short_socket_dir",
]

#: Linux caps sockaddr_un.sun_path at 108 bytes including the terminating NUL.
MAX_UNIX_PATH_BYTES = 107

Scheme = Literal["tcp", "unix", "mem"]

_SI = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_BIN = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "kib": 1024, "mib": 1024**2, "gib": 1024**3}
_DUR = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}
_NUM = r"([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)"


def _split(text: str, key: str) -> tuple[float, str]:
    m = re.fullmatch(_NUM + r"\s*([a-z]*)", text.strip().lower())
    if m is None:
        raise ConfigError(f"{key}: {text!r} is not a number", key=key, value=text)
    return float(m.group(1)), m.group(2)


def parse_rate(text: str, key: str = "rate") -> float:
    """``"100e6"``, ``"100M"``, ``"1.5Gbit"``, ``"inf"`` -> bit/s."""
    if text.strip().lower() in ("inf", "unlimited"):
        return math.inf
    value, unit = _split(text, key)
    unit = unit.removesuffix("bps").removesuffix("bit").removesuffix("b")
    if unit not in _SI:
        raise ConfigError(f"{key}: unknown rate unit in {text!r}", key=key, value=text)
    return value * _SI[unit]


def parse_duration(text: str, key: str = "delay") -> float:
    """``"0.02"``, ``"20ms"``, ``"500us"`` -> seconds."""
    value, unit = _split(text, key)
    if unit not in _DUR:
        raise ConfigError(f"{key}: unknown time unit in {text!r}", key=key, value=text)
    return value * _DUR[unit]


def parse_bytes(text: str, key: str = "burst") -> int:
    """``"65536"``, ``"64KiB"``, ``"1M"`` -> bytes."""
    value, unit = _split(text, key)
    unit = unit.removesuffix("b") if unit not in ("kib", "mib", "gib") else unit
    if unit not in _BIN:
        raise ConfigError(f"{key}: unknown size unit in {text!r}", key=key, value=text)
    return int(value * _BIN[unit])


@dataclass(frozen=True)
class Endpoint:
    """A parsed transport URL. ``url`` is the address without the shaping query."""

    scheme: Scheme
    url: str
    host: str = ""
    port: int = 0
    path: str = ""
    shape: LinkShape | None = None


_SHAPE_KEYS: dict[str, tuple[str, Any]] = {
    "rate": ("rate_bps", parse_rate),
    "delay": ("delay_s", parse_duration),
    "jitter": ("jitter_s", parse_duration),
    "burst": ("burst", parse_bytes),
    "chunk": ("chunk", parse_bytes),
    "queue": ("queue", parse_bytes),
}


def _parse_shape(query: str, url: str) -> LinkShape | None:
    if not query:
        return None
    kwargs: dict[str, Any] = {}
    for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        if key not in _SHAPE_KEYS:
            raise ConfigError(
                f"unknown query key {key!r} in {url!r}; known: {', '.join(_SHAPE_KEYS)}", key=key, value=url
            )
        field, parse = _SHAPE_KEYS[key]
        kwargs[field] = parse(value, key)
    try:
        return LinkShape(**kwargs)
    except ConfigError as exc:
        raise ConfigError(f"{url!r}: {exc.message}", key=exc.fields.get("key"), value=url) from None


def parse_url(url: str) -> Endpoint:
    """Split a transport URL; unknown schemes, missing ports and bad queries raise ConfigError."""
    if not isinstance(url, str) or "://" not in url:
        raise ConfigError(
            f"not a transport URL: {url!r} (want tcp://, unix:// or mem://)", key="url", value=url
        )
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if parts.fragment:
        raise ConfigError(f"{url!r}: fragments are not allowed", key="url", value=url)
    shape = _parse_shape(parts.query, url)
    if scheme == "tcp":
        try:
            host, port = parts.hostname, parts.port
        except ValueError:
            raise ConfigError(
                f"{url!r}: port must be an integer in 0..65535", key="port", value=url
            ) from None
        if not host:
            raise ConfigError(f"{url!r}: missing host", key="host", value=url)
        if port is None:
            raise ConfigError(f"{url!r}: missing port", key="port", value=url)
        if parts.path not in ("", "/"):
            raise ConfigError(f"{url!r}: a tcp URL has no path", key="url", value=url)
        base = f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
        return Endpoint("tcp", base, host=host, port=port, shape=shape)
    if scheme == "unix":
        path = parts.netloc + parts.path
        if not path:
            raise ConfigError(f"{url!r}: missing socket path", key="path", value=url)
        if len(path.encode()) > MAX_UNIX_PATH_BYTES:
            raise ConfigError(
                f"{url!r}: socket path longer than {MAX_UNIX_PATH_BYTES} bytes", key="path", value=url
            )
        return Endpoint("unix", f"unix://{path}", path=path, shape=shape)
    if scheme == "mem":
        name = parts.netloc + parts.path
        if not name:
            raise ConfigError(f"{url!r}: missing name", key="name", value=url)
        return Endpoint("mem", f"mem://{name}", path=name, shape=shape)
    raise ConfigError(f"unknown transport scheme {scheme!r} in {url!r}", key="scheme", value=url)


@contextlib.contextmanager
def short_socket_dir(prefix: str = "wanrt") -> Iterator[Path]:
    """A fresh directory directly under /tmp, removed afterwards, for unix sockets: a pytest or user temp
    dir can be deep enough that ``dir/name.sock`` exceeds :data:`MAX_UNIX_PATH_BYTES`."""
    path = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    try:
        yield Path(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)
