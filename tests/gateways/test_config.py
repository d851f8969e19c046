"""Loading ``wanrt gateway`` site files: the example loads, and every bad value is reported by its key."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from gateways.config import EdfConfig, GatewayConfig, PeerShape, RateConfig, load_gateway_config
from gateways.sending.edf_queue import EdfQueue, make_send_queue
from gateways.sending.rate_allocator import RateAllocator
from wanrt.config import from_mapping
from wanrt.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "site-a.toml"
SECRET = "s3cret-s3cret-s3cret"


def _write(tmp_path: Path, body: str, *, secret: str | None = SECRET) -> Path:
    if secret is not None:
        (tmp_path / "job.secret").write_text(secret + "\n")
    path = tmp_path / "site.toml"
    path.write_text(body)
    return path


MINIMAL = """
[gateway]
site = "a"
job = "j1"
secret_file = "job.secret"
[gateway.peers]
b = "tcp://10.0.0.2:7700"
c = "unix:///run/c.sock"
"""


def test_example_config_loads(tmp_path: Path) -> None:
    shutil.copy(EXAMPLE, tmp_path / "site-a.toml")
    (tmp_path / "site-a.secret").write_text(SECRET)
    cfg = load_gateway_config(tmp_path / "site-a.toml")
    assert cfg.site == "a" and set(cfg.peers) == {"b", "c"}
    assert cfg.secret_file == str((tmp_path / "site-a.secret").resolve())
    assert cfg.secret_bytes() == SECRET.encode()
    assert cfg.base_rates_bps() == {"b": 100e6, "c": 50e6}
    assert cfg.rounds.topology == "tree" and cfg.edf.policy == "edf"
    assert cfg.shaping["c"] == PeerShape(rate_bps=50e6, delay_s=0.05)
    assert cfg.rates == RateConfig()  # the example documents the paper's defaults


def test_minimal_config_gets_defaults_and_resolves_the_secret(tmp_path: Path) -> None:
    cfg = load_gateway_config(_write(tmp_path, MINIMAL))
    assert cfg.secret_bytes() == SECRET.encode()  # trailing newline stripped
    assert cfg.edf == EdfConfig() and cfg.rates == RateConfig()
    assert cfg.metrics_port == 0 and cfg.metrics_host == "127.0.0.1"
    with pytest.raises(TypeError):
        cfg.peers["d"] = "tcp://x:1"  # type: ignore[index]
    with pytest.raises(AttributeError):
        cfg.site = "b"  # type: ignore[misc]


def test_config_objects_drive_the_policies(tmp_path: Path) -> None:
    cfg = load_gateway_config(_write(tmp_path, MINIMAL))
    assert isinstance(make_send_queue(cfg.edf), EdfQueue)
    alloc = RateAllocator(cfg.peers, cfg.base_rates_bps(), cfg.rates)
    assert alloc.rates() == {"b": 100e6, "c": 100e6}


def test_inline_secret_is_accepted_and_hidden_from_repr() -> None:
    cfg = from_mapping(GatewayConfig, {"site": "a", "job": "j", "secret": SECRET}, section="gateway")
    assert cfg.secret_bytes() == SECRET.encode()
    assert SECRET not in repr(cfg)


def test_trace_and_tls_paths_resolve_relative_to_the_file(tmp_path: Path) -> None:
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "wan.csv").write_text("0,100e6\n")
    (tmp_path / "cert.pem").write_text("x")
    body = MINIMAL + '[gateway.shaping.b]\ntrace = "traces/wan.csv"\n[gateway.tls]\ncertfile = "cert.pem"\n'
    cfg = load_gateway_config(_write(tmp_path, body))
    assert cfg.shaping["b"].trace == str((tmp_path / "traces" / "wan.csv").resolve())
    assert cfg.tls is not None and cfg.tls.certfile == str((tmp_path / "cert.pem").resolve())


BAD: list[tuple[str, str]] = [
    # (replacement or addition to MINIMAL, key named in the error)
    ('site = "a"\n', "gateway.site"),  # removed below: missing
    ('site = "a b"', "gateway.site"),
    ('job = ""', "gateway.job"),
    ('secret_file = "job.secret"\nsecret = "inline-secret-1234567"', "gateway.secret_file"),
    ('secret_file = "job.secret"', "gateway.secret_file"),  # removed: neither set
    ('listen = "http://x:1"', "gateway.listen"),
    ('listen = "tcp://host"', "gateway.listen"),
    ('trainer_listen = "unix://"', "gateway.trainer_listen"),
    ("metrics_port = 70000", "gateway.metrics_port"),
    ('b = "tcp://10.0.0.2:0"', "gateway.peers.b"),
    ('b = "tcp://10.0.0.2:7700"\na = "tcp://10.0.0.1:7700"', "gateway.peers.a"),
    ('root = "z"', "gateway.root"),
    ("reconnect_max_s = 0.1", "gateway.reconnect_max_s"),
    ("reconnect_factor = 0.5", "gateway.reconnect_factor"),
    ("shutdown_deadline_s = -1", "gateway.shutdown_deadline_s"),
    ("link_rate_bps = 0", "gateway.link_rate_bps"),
    ('tcp_congestion = "BBR"', "gateway.tcp_congestion"),
    ("pacer_burst_s = 0", "gateway.pacer_burst_s"),
    ("pacer_burst_s = 2.0", "gateway.pacer_burst_s"),
    ('tcp_congestion = "a-very-long-cc-name"', "gateway.tcp_congestion"),
    ("bogus = 1", "gateway.bogus"),
    ("[gateway.peer_rates_bps]\nz = 1e6", "gateway.peer_rates_bps.z"),
    ("[gateway.peer_rates_bps]\nb = -1.0", "gateway.peer_rates_bps.b"),
    ('[gateway.edf]\npolicy = "lifo"', "gateway.edf.policy"),
    ("[gateway.edf]\nchunk_bytes = 100", "gateway.edf.chunk_bytes"),
    ("[gateway.edf]\nchunk_bytes = 2048\ncoalesce_bytes = 4096", "gateway.edf.coalesce_bytes"),
    ("[gateway.rates]\nstreak = 0", "gateway.rates.streak"),
    ("[gateway.rates]\nslow_factor = 1.0", "gateway.rates.slow_factor"),
    ("[gateway.rates]\nalpha = 0", "gateway.rates.alpha"),
    ("[gateway.rates]\nbeta = 1.0", "gateway.rates.beta"),
    ("[gateway.rates]\nrecovery = 0", "gateway.rates.recovery"),
    ("[gateway.rates]\ncooldown = -1", "gateway.rates.cooldown"),
    ("[gateway.rates]\nmax_boost = 0.5", "gateway.rates.max_boost"),
    ("[gateway.rates]\nmin_share = 0", "gateway.rates.min_share"),
    ('[gateway.rates]\nenabled = "yes"', "gateway.rates.enabled"),
    ('[gateway.rounds]\ntopology = "mesh"', "gateway.rounds.topology"),
    ("[gateway.shaping.z]\nrate_bps = 1e6", "gateway.shaping.z"),
    ("[gateway.shaping.b]\ndelay_s = -0.1", "gateway.shaping.b.delay_s"),
    ("[gateway.shaping.b]\njitter_s = -1", "gateway.shaping.b.jitter_s"),
    ("[gateway.shaping.b]\nrate_bps = -5", "gateway.shaping.b.rate_bps"),
    ('c = "tcp://10.0.0.3:7700?rate=1M"\n[gateway.shaping.c]\ndelay_s = 1', "gateway.shaping.c"),
    ('b = "tcp://10.0.0.2:7700?speed=1M"', "gateway.peers.b"),
    ("[gateway.timeouts]\nconnect = 0", "gateway.timeouts.connect"),
    ("[gateway.timeouts]\nheartbeat_misses = 0", "gateway.timeouts.heartbeat_misses"),
    ('[gateway.tls]\nkeyfile = "k.pem"', "gateway.tls.keyfile"),
    ('[gateway.tls]\ncertfile = "missing.pem"', "gateway.tls.certfile"),
    ('[gateway.shaping.b]\ntrace = "missing.csv"', "gateway.shaping.b.trace"),
    ("[other]\nx = 1", "other"),
]


def _bad_body(change: str) -> str:
    if change in ('site = "a"\n', 'secret_file = "job.secret"'):
        return MINIMAL.replace(change if change.endswith("\n") else change + "\n", "")
    first = change.partition("\n")[0]
    key = first.split("=")[0].strip()
    if first.startswith("["):
        return MINIMAL + change + "\n"
    lines = MINIMAL.splitlines()
    for i, line in enumerate(lines):
        if line.split("=")[0].strip() == key:
            lines[i] = change
            return "\n".join(lines) + "\n"
    header = lines.index("[gateway.peers]")
    return "\n".join([*lines[:header], change, *lines[header:]]) + "\n"


@pytest.mark.parametrize(("change", "key"), BAD)
def test_bad_files_name_the_bad_key(tmp_path: Path, change: str, key: str) -> None:
    path = _write(tmp_path, _bad_body(change))
    with pytest.raises(ConfigError) as info:
        load_gateway_config(path)
    assert info.value.fields["key"] == key, info.value


@pytest.mark.parametrize(
    ("secret", "why"), [(None, "cannot read"), ("short", "must hold"), ("x" * 5000, "must hold")]
)
def test_bad_secret_files(tmp_path: Path, secret: str | None, why: str) -> None:
    with pytest.raises(ConfigError, match=why) as info:
        load_gateway_config(_write(tmp_path, MINIMAL, secret=secret))
    assert info.value.fields["key"] == "gateway.secret_file"


def test_file_level_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        load_gateway_config(tmp_path / "nope.toml")
    with pytest.raises(ConfigError) as info:
        load_gateway_config(_write(tmp_path, "[server]\n"))
    assert info.value.fields["key"] == "server"
    with pytest.raises(ConfigError) as info:
        load_gateway_config(_write(tmp_path, "x = 1\n"))
    assert info.value.fields["key"] == "x"
    with pytest.raises(ConfigError) as info:
        load_gateway_config(_write(tmp_path, ""))
    assert info.value.fields["key"] == "gateway"


def test_base_rate_of_unknown_peer_is_an_error() -> None:
    cfg = from_mapping(GatewayConfig, {"site": "a", "job": "j", "secret": SECRET}, section="gateway")
    with pytest.raises(ConfigError):
        cfg.base_rate_bps("b")


@pytest.mark.parametrize(
    "url", ["tcp://[::1]:7700", "tcp://gw.example.org:1", "unix:///run/wanrt.sock", "mem://site-b"]
)
def test_accepted_peer_urls(url: str) -> None:
    data: dict[str, Any] = {"site": "a", "job": "j", "secret": SECRET, "peers": {"b": url}}
    assert from_mapping(GatewayConfig, data, section="gateway").peers["b"] == url
