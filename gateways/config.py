"""Settings of one site's gateway (``wanrt gateway --config site.toml``), validated when the file is loaded.

Everything the gateway daemon, its send queue and its rate allocator may tune lives here as frozen
dataclasses with defaults, so a typo or an out-of-range value stops the daemon at start-up with a
:class:`~wanrt.errors.ConfigError` naming the key (``gateway.rates.alpha``) instead of surfacing hours
later as a stalled round. The annotated example is ``docs/examples/site-a.toml``.

File layout::

    [gateway]               GatewayConfig (site, job, listen, peers, topology, timeouts, ...)
    [gateway.peers]         site name -> url of that site's gateway
    [gateway.peer_rates_bps] optional per-peer base rate, overriding link_rate_bps
    [gateway.edf]           EdfConfig: send-queue policy and chunking
    [gateway.rates]         RateConfig: straggler-link rate reallocation (seed 002)
    [gateway.shaping.NAME]  LinkShape: emulated WAN link towards peer NAME (tests and demos only)
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, Literal
from urllib.parse import urlsplit

from wanrt.config import check, from_mapping, load_toml
from wanrt.errors import ConfigError

__all__ = [
    "MAX_CHUNK_BYTES",
    "MAX_OPEN_ITERATIONS",
    "MAX_PEERS",
    "MIN_CHUNK_BYTES",
    "MIN_SECRET_BYTES",
    "EdfConfig",
    "GatewayConfig",
    "LinkShape",
    "RateConfig",
    "load_gateway_config",
]

#: A chunk is the unit of non-preemption on a link: at 100 Mbit/s a 16 MiB chunk already blocks an urgent
#: layer for 1.3 s, so larger chunks defeat EDF; it also stays far below any sane frame-size limit.
MAX_CHUNK_BYTES: Final = 16 << 20
#: Each chunk pays a frame header (tens of bytes); below 512 B that overhead exceeds ~5 %.
MIN_CHUNK_BYTES: Final = 512
#: Partial staleness is at most 1 (StellaTrain §3.3), so 2 open iterations suffice; 64 bounds the memory a
#: misconfigured gateway can pin in half-finished rounds.
MAX_OPEN_ITERATIONS: Final = 64
#: Every peer costs a connection, a send sub-queue and per-round state; a job spanning more sites than this
#: is a configuration mistake rather than a deployment.
MAX_PEERS: Final = 256
#: The job secret keys the handshake MAC; shorter secrets are guessable offline.
MIN_SECRET_BYTES: Final = 16

_SITE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_SCHEMES = ("tcp", "unix", "mem")


def _url_problem(url: str, *, allow_port_zero: bool) -> str | None:
    """Why ``url`` is not a usable transport url (``tcp://host:port``, ``unix:///path``, ``mem://name``)."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        return str(exc)
    if parts.scheme not in _SCHEMES:
        return f"scheme must be one of {', '.join(_SCHEMES)}"
    if parts.scheme == "unix":
        return None if (parts.netloc + parts.path) else "unix url needs a socket path"
    if parts.scheme == "mem":
        return None if parts.netloc else "mem url needs a name"
    try:
        port = parts.port
    except ValueError:
        return "port must be an integer in 0..65535"
    if not parts.hostname:
        return "tcp url needs a host"
    if port is None:
        return "tcp url needs a port"
    if port == 0 and not allow_port_zero:
        return "port 0 is only allowed for listening"
    return None


def _check_url(key: str, url: str, *, allow_port_zero: bool = False) -> None:
    problem = _url_problem(url, allow_port_zero=allow_port_zero)
    check(problem is None, key, url, problem or "")


@dataclass(frozen=True)
class EdfConfig:
    """The per-link send queue (:mod:`gateways.edf`).

    ``edf`` sends the most urgent (iteration, layer) first, StellaTrain §3.3; ``fifo`` is the first-come
    baseline kept for the EDF-vs-FIFO comparison. Chunks bound how long an urgent layer waits behind a
    large one already on the wire. Pieces shorter than ``coalesce_bytes`` (message headers, tiny layers) are
    copied together into one chunk rather than each paying a frame.
    """

    policy: Literal["edf", "fifo"] = "edf"
    chunk_bytes: int = 256 << 10
    coalesce_bytes: int = 4 << 10

    def __post_init__(self) -> None:
        check(
            MIN_CHUNK_BYTES <= self.chunk_bytes <= MAX_CHUNK_BYTES,
            "chunk_bytes",
            self.chunk_bytes,
            f"must be in {MIN_CHUNK_BYTES}..{MAX_CHUNK_BYTES}",
        )
        check(
            0 <= self.coalesce_bytes <= self.chunk_bytes,
            "coalesce_bytes",
            self.coalesce_bytes,
            "must be in 0..chunk_bytes",
        )


@dataclass(frozen=True)
class RateConfig:
    """Straggler-link rate reallocation (:mod:`gateways.rates`), seed 002 "Straggler-Aware Scheduler".

    Paper values are the defaults: streak K = 3 iterations slower than 1.2 × the median, boost α = 0.3,
    donor penalty β = 0.15 shared by the donors, recovery r ← 0.5·r + 0.5·r_base, cooldown 5 iterations.
    ``max_boost``, ``min_share`` and ``conserve_total`` are ours: the paper compounds boosts without a bound
    and lets the sum of rates drift above the base sum, which a real uplink cannot honour.
    """

    enabled: bool = True
    streak: int = 3
    slow_factor: float = 1.2
    alpha: float = 0.3
    beta: float = 0.15
    recovery: float = 0.5
    cooldown: int = 5
    max_boost: float = 4.0
    min_share: float = 0.25
    conserve_total: bool = False

    def __post_init__(self) -> None:
        check(1 <= self.streak <= 1000, "streak", self.streak, "must be in 1..1000 iterations")
        check(1.0 < self.slow_factor <= 100.0, "slow_factor", self.slow_factor, "must be in (1, 100]")
        check(0.0 < self.alpha <= 10.0, "alpha", self.alpha, "must be in (0, 10]")
        check(0.0 <= self.beta < 1.0, "beta", self.beta, "must be in [0, 1)")
        check(0.0 < self.recovery <= 1.0, "recovery", self.recovery, "must be in (0, 1]")
        check(0 <= self.cooldown <= 10_000, "cooldown", self.cooldown, "must be in 0..10000 iterations")
        check(1.0 <= self.max_boost <= 100.0, "max_boost", self.max_boost, "must be in [1, 100]")
        check(0.0 < self.min_share <= 1.0, "min_share", self.min_share, "must be in (0, 1]")


@dataclass(frozen=True)
class LinkShape:
    """Emulated WAN link towards one peer (token-bucket rate, one-way delay, jitter), for demos and tests.

    ``trace`` names a bandwidth trace file (resolved relative to the config file); when given it drives the
    rate over time and ``rate_bps`` is the starting rate. ``rate_bps = 0`` means unshaped.
    """

    rate_bps: float = 0.0
    delay_s: float = 0.0
    jitter_s: float = 0.0
    trace: str | None = None

    def __post_init__(self) -> None:
        check(0.0 <= self.rate_bps <= 1e13, "rate_bps", self.rate_bps, "must be in [0, 1e13] (0 = unshaped)")
        check(0.0 <= self.delay_s <= 60.0, "delay_s", self.delay_s, "must be in [0, 60] seconds")
        check(0.0 <= self.jitter_s <= 60.0, "jitter_s", self.jitter_s, "must be in [0, 60] seconds")
        check(self.trace is None or self.trace != "", "trace", self.trace, "must be a file path")


def _frozen_map(value: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(value))


@dataclass(frozen=True)
class GatewayConfig:
    """The ``[gateway]`` section: who this site is, whom it talks to, and every timeout and limit.

    The job secret comes from ``secret_file`` (preferred: keeps it out of the config, which gets pasted
    into bug reports) or inline ``secret``; exactly one must be set. ``secret`` is excluded from ``repr``.
    """

    site: str
    job: str
    secret: str | None = field(default=None, repr=False)
    secret_file: str | None = None
    listen: str = "tcp://127.0.0.1:7700"
    trainer_listen: str = "unix:///tmp/wanrt-gateway.sock"
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    peers: Mapping[str, str] = field(default_factory=dict)
    topology: Literal["star", "tree", "ring", "parent_child"] = "star"
    tree_arity: int = 2
    root: str | None = None
    round_deadline_s: float = 30.0
    straggler_wait_s: float = 2.0
    max_open_iterations: int = 2
    heartbeat_interval_s: float = 1.0
    heartbeat_misses: int = 3
    reconnect_initial_s: float = 0.5
    reconnect_max_s: float = 30.0
    reconnect_factor: float = 2.0
    shutdown_deadline_s: float = 10.0
    forward_policy: Literal["k_over_n", "resparsify"] = "k_over_n"
    forward_cap: float = 1.0
    link_rate_bps: float = 100e6
    peer_rates_bps: Mapping[str, float] = field(default_factory=dict)
    edf: EdfConfig = field(default_factory=EdfConfig)
    rates: RateConfig = field(default_factory=RateConfig)
    shaping: Mapping[str, LinkShape] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "peers", _frozen_map(self.peers))
        object.__setattr__(self, "peer_rates_bps", _frozen_map(self.peer_rates_bps))
        object.__setattr__(self, "shaping", _frozen_map(self.shaping))
        self._check_identity()
        self._check_endpoints()
        self._check_timing()
        self._check_rates()

    def _check_identity(self) -> None:
        check(bool(_SITE_NAME.match(self.site)), "site", self.site, "letters, digits, _ . - (max 63)")
        check(bool(_SITE_NAME.match(self.job)), "job", self.job, "letters, digits, _ . - (max 63)")
        check(
            (self.secret is None) != (self.secret_file is None),
            "secret_file",
            self.secret_file,
            "set exactly one of secret_file (preferred) or secret",
        )
        if self.secret is not None:
            check(
                len(self.secret.encode()) >= MIN_SECRET_BYTES,
                "secret",
                "<hidden>",
                f"must be at least {MIN_SECRET_BYTES} bytes",
            )
        check(self.secret_file != "", "secret_file", self.secret_file, "must be a file path")

    def _check_endpoints(self) -> None:
        _check_url("listen", self.listen, allow_port_zero=True)
        _check_url("trainer_listen", self.trainer_listen, allow_port_zero=True)
        check(0 <= self.metrics_port <= 65535, "metrics_port", self.metrics_port, "0 (off) or a port")
        check(bool(self.metrics_host), "metrics_host", self.metrics_host, "must be a host name or address")
        check(len(self.peers) <= MAX_PEERS, "peers", len(self.peers), f"at most {MAX_PEERS} peers")
        for name, url in self.peers.items():
            key = f"peers.{name}"
            check(bool(_SITE_NAME.match(name)), key, name, "site names: letters, digits, _ . - (max 63)")
            check(name != self.site, key, name, "a site must not list itself as a peer")
            _check_url(key, url)
        check(2 <= self.tree_arity <= MAX_PEERS, "tree_arity", self.tree_arity, f"must be in 2..{MAX_PEERS}")
        if self.root is not None:
            check(
                self.root == self.site or self.root in self.peers,
                "root",
                self.root,
                "must be this site or one of the peers",
            )

    def _check_timing(self) -> None:
        def positive(key: str, value: float, upper: float) -> None:
            check(0.0 < value <= upper, key, value, f"must be in (0, {upper:g}] seconds")

        positive("round_deadline_s", self.round_deadline_s, 3600.0)
        check(
            0.0 <= self.straggler_wait_s <= self.round_deadline_s,
            "straggler_wait_s",
            self.straggler_wait_s,
            "must be in [0, round_deadline_s]",
        )
        check(
            1 <= self.max_open_iterations <= MAX_OPEN_ITERATIONS,
            "max_open_iterations",
            self.max_open_iterations,
            f"must be in 1..{MAX_OPEN_ITERATIONS}",
        )
        positive("heartbeat_interval_s", self.heartbeat_interval_s, 600.0)
        check(1 <= self.heartbeat_misses <= 100, "heartbeat_misses", self.heartbeat_misses, "in 1..100")
        positive("reconnect_initial_s", self.reconnect_initial_s, 600.0)
        positive("reconnect_max_s", self.reconnect_max_s, 3600.0)
        check(
            self.reconnect_max_s >= self.reconnect_initial_s,
            "reconnect_max_s",
            self.reconnect_max_s,
            "must be >= reconnect_initial_s",
        )
        check(1.0 <= self.reconnect_factor <= 10.0, "reconnect_factor", self.reconnect_factor, "in [1, 10]")
        positive("shutdown_deadline_s", self.shutdown_deadline_s, 3600.0)

    def _check_rates(self) -> None:
        check(0.0 < self.forward_cap <= 64.0, "forward_cap", self.forward_cap, "must be in (0, 64]")
        check(0.0 < self.link_rate_bps <= 1e13, "link_rate_bps", self.link_rate_bps, "in (0, 1e13] bit/s")
        for name, rate in self.peer_rates_bps.items():
            key = f"peer_rates_bps.{name}"
            check(name in self.peers, key, name, "not one of the peers")
            check(0.0 < rate <= 1e13, key, rate, "must be in (0, 1e13] bit/s")
        for name in self.shaping:
            check(name in self.peers, f"shaping.{name}", name, "not one of the peers")

    def base_rate_bps(self, peer: str) -> float:
        """The rate the allocator returns to once ``peer``'s link stops straggling."""
        if peer not in self.peers:
            raise ConfigError(f"unknown peer {peer!r}", key="peers", value=peer)
        return float(self.peer_rates_bps.get(peer, self.link_rate_bps))

    def base_rates_bps(self) -> dict[str, float]:
        return {p: self.base_rate_bps(p) for p in self.peers}

    def secret_bytes(self) -> bytes:
        """The job secret; read from ``secret_file`` (trailing newline stripped) at each call."""
        if self.secret is not None:
            return self.secret.encode()
        assert self.secret_file is not None  # __post_init__ guarantees exactly one
        path = Path(self.secret_file)
        try:
            data = path.read_bytes().rstrip(b"\r\n")
        except OSError as exc:
            raise ConfigError(
                f"cannot read secret_file {str(path)!r}: {exc.strerror}", key="gateway.secret_file"
            ) from None
        if len(data) < MIN_SECRET_BYTES:
            raise ConfigError(
                f"secret_file {str(path)!r} holds fewer than {MIN_SECRET_BYTES} bytes",
                key="gateway.secret_file",
            )
        return data


def _resolve(base: Path, value: str) -> str:
    p = Path(value).expanduser()
    return str(p if p.is_absolute() else (base / p).resolve())


def load_gateway_config(path: str | Path) -> GatewayConfig:
    """Load and validate a site file; ``secret_file`` and trace paths are taken relative to the file.

    The secret is read once here so that a missing or short secret file fails at start-up, not at the
    first handshake; trace files must exist.
    """
    p = Path(path)
    data = load_toml(p)
    unknown = sorted(set(data) - {"gateway"})
    if unknown:
        raise ConfigError(f"unknown top-level table {unknown[0]!r}; expected [gateway]", key=unknown[0])
    if "gateway" not in data:
        raise ConfigError(f"{p}: missing [gateway] table", key="gateway", path=str(p))
    cfg = from_mapping(GatewayConfig, data["gateway"], section="gateway")
    base = p.resolve().parent
    changes: dict[str, Any] = {}
    if cfg.secret_file is not None:
        changes["secret_file"] = _resolve(base, cfg.secret_file)
    shaping = {}
    for name, shape in cfg.shaping.items():
        if shape.trace is not None:
            trace = _resolve(base, shape.trace)
            if not Path(trace).is_file():
                raise ConfigError(f"trace file not found: {trace}", key=f"gateway.shaping.{name}.trace")
            shape = dataclasses.replace(shape, trace=trace)
        shaping[name] = shape
    changes["shaping"] = shaping
    cfg = dataclasses.replace(cfg, **changes)
    cfg.secret_bytes()
    return cfg
