"""URL parsing: every scheme, shaping queries, and ConfigError for anything malformed."""

from __future__ import annotations

import math

import pytest

from transports import LinkShape, Timeouts, parse_url
from transports.urls import parse_bytes, parse_duration, parse_rate
from wanrt.config import from_mapping
from wanrt.errors import ConfigError


def test_schemes() -> None:
    ep = parse_url("tcp://127.0.0.1:9000")
    assert (ep.scheme, ep.host, ep.port, ep.shape) == ("tcp", "127.0.0.1", 9000, None)
    ep = parse_url("tcp://[::1]:0")
    assert (ep.host, ep.port, ep.url) == ("::1", 0, "tcp://[::1]:0")
    ep = parse_url("unix:///run/wanrt/gw.sock")
    assert (ep.scheme, ep.path) == ("unix", "/run/wanrt/gw.sock")
    ep = parse_url("mem://site-a")
    assert (ep.scheme, ep.path) == ("mem", "site-a")


def test_shaping_query() -> None:
    ep = parse_url("tcp://10.0.0.1:9000?rate=100e6&delay=0.02")
    assert ep.url == "tcp://10.0.0.1:9000"
    assert ep.shape == LinkShape(rate_bps=100e6, delay_s=0.02)
    ep = parse_url("mem://x?rate=1.5G&delay=20ms&jitter=500us&burst=64KiB&chunk=4k&queue=2MiB")
    assert ep.shape == LinkShape(
        rate_bps=1.5e9, delay_s=0.02, jitter_s=0.0005, burst=65536, chunk=4000, queue=2 << 20
    )
    assert parse_url("mem://x?rate=inf").shape == LinkShape(rate_bps=math.inf)


@pytest.mark.parametrize(
    ("url", "key"),
    [
        ("http://x:1", "scheme"),
        ("tcp://127.0.0.1", "port"),
        ("tcp://127.0.0.1:99999", "port"),
        ("tcp://127.0.0.1:abc", "port"),
        ("tcp://:80", "host"),
        ("tcp://h:1/path", "url"),
        ("unix://", "path"),
        ("unix:///" + "x" * 200, "path"),
        ("mem://", "name"),
        ("127.0.0.1:80", "url"),
        ("mem://x?speed=1", "speed"),
        ("mem://x?rate=fast", "rate"),
        ("mem://x?rate=0", "rate_bps"),
        ("mem://x?delay=5parsecs", "delay"),
        ("mem://x?burst=-1", "burst"),
        ("mem://x#frag", "url"),
    ],
)
def test_malformed_urls(url: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_url(url)
    assert info.value.fields["key"] == key


def test_unit_parsers() -> None:
    assert parse_rate("100Mbps") == 100e6
    assert parse_rate("250kbit") == 250e3
    assert parse_duration("1.5s") == 1.5
    assert parse_bytes("1MiB") == 1 << 20
    assert parse_bytes("2k") == 2000


def test_timeouts_from_toml_table() -> None:
    t = from_mapping(Timeouts, {"connect": 3, "recv_idle": 15.0, "heartbeat_misses": 4}, section="timeouts")
    assert t == Timeouts(connect=3.0, recv_idle=15.0, heartbeat_misses=4)
    assert t.peer_lost_after == 20.0
    with pytest.raises(ConfigError) as info:
        from_mapping(Timeouts, {"send": 0}, section="transport.timeouts")
    assert info.value.fields["key"] == "transport.timeouts.send"
    with pytest.raises(ConfigError):
        Timeouts(heartbeat_misses=0)
    with pytest.raises(ConfigError):
        Timeouts(recv_idle=-1.0)


def test_link_shape_from_toml_table() -> None:
    s = from_mapping(LinkShape, {"rate_bps": 1e8, "delay_s": 0.03}, section="shape")
    assert s == LinkShape(rate_bps=1e8, delay_s=0.03)
