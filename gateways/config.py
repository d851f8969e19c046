"""Settings of one site's gateway (``wanrt gateway --config site.toml``), validated when the file is loaded.

Everything the gateway daemon, its send queue and its rate allocator may tune lives here as frozen
dataclasses with defaults, so a typo or an out-of-range value stops the daemon at start-up with a
:class:`~wanrt.errors.ConfigError` naming the key (``gateway.rates.alpha``) instead of surfacing hours
later as a stalled round. The annotated example is ``docs/examples/site-a.toml``.

File layout::

    [gateway]               GatewayConfig (site, job, secret, listen urls, liveness and shutdown timeouts)
    [gateway.peers]         site name -> url of that site's gateway
    [gateway.rounds]        RoundConfig (gateways.rounds.config): topology, deadlines, t_w, forwarding
    [gateway.peer_rates_bps] optional per-peer base rate, overriding link_rate_bps
    [gateway.edf]           EdfConfig: send-queue policy and chunking       (gateways.sending.config)
    [gateway.rates]         RateConfig: straggler-link rate reallocation (gateways.sending.config)
    [gateway.delivery]      DeliveryConfig: the links' delivery-rate samples (gateways.sending.config)
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

from gateways.rounds.config import RoundConfig
from gateways.sending.config import MAX_CHUNK_BYTES, DeliveryConfig, EdfConfig, RateConfig
from gateways.sending.pacer import PACER_BURST_S
from transports.congestion import CONGESTION_NAME
from transports.link import LinkShape
from transports.timeouts import Timeouts
from transports.tls import TLSConfig
from transports.urls import parse_url
from wanrt.config import check, from_mapping, load_toml
from wanrt.errors import ConfigError
from wanrt.job_secret import check_secret_choice, read_secret_file
from wanrt.keys import Credentials, load_keys_file
from wanrt.protocol.limits import MAX_SITES

__all__ = [
    "MAX_CHUNK_BYTES",
    "MAX_PEERS",
    "DeliveryConfig",
    "EdfConfig",
    "GatewayConfig",
    "PeerShape",
    "RateConfig",
    "load_gateway_config",
]

#: A job spans at most MAX_SITES sites (the protocol's bound on Aggregate.sites), this one included.
MAX_PEERS: Final = MAX_SITES - 1

_SITE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


def _check_url(key: str, url: str, *, listening: bool = False) -> None:
    """Validate with the transports' own parser, re-keyed so the error names the config key."""
    try:
        endpoint = parse_url(url)
    except ConfigError as exc:
        raise ConfigError(f"invalid value for {key!r}: {exc.message}", key=key, value=url) from None
    check(listening or endpoint.scheme != "tcp" or endpoint.port != 0, key, url, "port 0 only for listening")


@dataclass(frozen=True)
class PeerShape(LinkShape):
    """Emulated WAN link towards one peer (:class:`transports.link.LinkShape`: rate, delay, jitter, ...).

    ``trace`` names a bandwidth trace file (:class:`transports.traces.BandwidthTrace`, resolved relative to
    the config file) that drives the rate over time, starting from ``rate_bps``. For demos and tests only.
    """

    trace: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.trace is None or self.trace != "", "trace", self.trace, "must be a file path")


def _frozen_map(value: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(value))


@dataclass(frozen=True)
class GatewayConfig:
    """The ``[gateway]`` section: who this site is, whom it talks to, and every timeout and limit.

    The job secret comes from ``secret_file`` (preferred: keeps it out of the config, which gets pasted
    into bug reports) or inline ``secret``; exactly one must be set. ``secret`` is excluded from ``repr``.

    Round timing (deadline, t_w, open-iteration window), topology and forwarding policy live in
    ``[gateway.rounds]``, the round engine's own :class:`~gateways.rounds.config.RoundConfig`, so there is
    one key for each of them; ``root`` is here because only the site list can validate it.

    ``scheduler`` is the job's scheduler (``tcp://host:port``; none: settings change only by
    ``POST /config``); the gateway reports to it every ``telemetry_interval_s``. ``POST /config`` needs
    the token in ``control_token_file`` (unset: no changes over HTTP) and is refused when a scheduler is
    configured (changes go to the scheduler, which gives them one job-wide effective iteration).

    ``non_finite`` — a payload holding NaN or ±Inf from a peer or the trainer would poison every site's
    aggregate: ``reject_link`` (default) closes that connection with the reason; ``drop_payload`` keeps
    the connection, counts the message with an empty payload and reports it (/status, the log).
    """

    site: str
    job: str
    secret: str | None = field(default=None, repr=False)
    secret_file: str | None = None
    keys_file: str | None = None
    listen: str = "tcp://127.0.0.1:7700"
    trainer_listen: str = "unix:///tmp/wanrt-gateway.sock"
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    peers: Mapping[str, str] = field(default_factory=dict)
    root: str | None = None
    reconnect_initial_s: float = 0.5
    reconnect_max_s: float = 30.0
    reconnect_factor: float = 2.0
    shutdown_deadline_s: float = 10.0
    link_rate_bps: float = 100e6
    peer_rates_bps: Mapping[str, float] = field(default_factory=dict)
    rounds: RoundConfig = field(default_factory=RoundConfig)
    edf: EdfConfig = field(default_factory=EdfConfig)
    rates: RateConfig = field(default_factory=RateConfig)
    delivery: DeliveryConfig = field(default_factory=DeliveryConfig)
    timeouts: Timeouts = field(default_factory=Timeouts)
    tls: TLSConfig | None = None
    shaping: Mapping[str, PeerShape] = field(default_factory=dict)
    scheduler: str | None = None
    telemetry_interval_s: float = 1.0
    control_token_file: str | None = None
    # where this gateway keeps the job's frontier so that gateways restarted together resume the job
    # instead of starting it anew at iteration 0 (gateways/service/state_file.py); unset: not kept
    state_file: str | None = None
    non_finite: str = "reject_link"
    # how long after this site's trainer died (its connection ended without Bye, or went silent) the
    # gateway starts pushing empty contributions for it, so the other sites train on without it (a
    # reconnect of the same run comes back sooner; gateways/node/trainer_runs.py)
    trainer_gone_grace_s: float = 2.0
    # the iteration of the trainers' checkpoint a stopped job resumes from (`wanrt gateway --resume-at N`,
    # the same N at every gateway): a fresh gateway starts the job there instead of at 0 or at its
    # state_file's frontier (docs/client.md, "Checkpoint and resume"); 0 or more than rounds.window
    resume_at: int | None = None
    # Which peers this gateway expects a link to: "all" (a full mesh, the default) or "plan" (only its
    # neighbours in the round plan: parent and children in a tree, ring neighbours). Added for the
    # simulator's 1 000-site trees, where a mesh would be 500k links (issue 8 part 3; see docs/sim.md).
    links: Literal["all", "plan"] = "all"
    # A site that has not contributed to any round here yet (its trainer is still starting: sites are
    # launched seconds apart) is warned about ("rounds complete without site b ...") only once it has been
    # missing for this long; a site that took part before, after 3 missed rounds in a row (issue 21: every
    # normal start warned "is its trainer running?")
    absent_warn_after_s: float = 30.0
    # The TCP congestion control of every WAN link's socket (transports/congestion.py): "" (default) keeps
    # the host's net.ipv4.tcp_congestion_control; a name ("cubic", "bbr", ...) sets it per link, and a name
    # the kernel refuses is logged and the host's default runs. docs/gateway.md says which to pick.
    tcp_congestion: str = ""
    # The pacer's bucket as time at the link's rate: how far the writer may run ahead of the pacing, i.e.
    # how long an event-loop stall the kernel's queued bytes cover (gateways/sending/pacer.py)
    pacer_burst_s: float = PACER_BURST_S

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
        check_secret_choice(self.secret, self.secret_file, self.keys_file)

    def _check_endpoints(self) -> None:
        _check_url("listen", self.listen, listening=True)
        _check_url("trainer_listen", self.trainer_listen, listening=True)
        check(0 <= self.metrics_port <= 65535, "metrics_port", self.metrics_port, "0 (off) or a port")
        check(bool(self.metrics_host), "metrics_host", self.metrics_host, "must be a host name or address")
        check(len(self.peers) <= MAX_PEERS, "peers", len(self.peers), f"at most {MAX_PEERS} peers")
        for name, url in self.peers.items():
            key = f"peers.{name}"
            check(bool(_SITE_NAME.match(name)), key, name, "site names: letters, digits, _ . - (max 63)")
            check(name != self.site, key, name, "a site must not list itself as a peer")
            _check_url(key, url)
        if self.scheduler is not None:
            _check_url("scheduler", self.scheduler)
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

        positive("reconnect_initial_s", self.reconnect_initial_s, 600.0)
        positive("absent_warn_after_s", self.absent_warn_after_s, 86400.0)
        positive("reconnect_max_s", self.reconnect_max_s, 3600.0)
        check(
            self.reconnect_max_s >= self.reconnect_initial_s,
            "reconnect_max_s",
            self.reconnect_max_s,
            "must be >= reconnect_initial_s",
        )
        check(1.0 <= self.reconnect_factor <= 10.0, "reconnect_factor", self.reconnect_factor, "in [1, 10]")
        positive("shutdown_deadline_s", self.shutdown_deadline_s, 3600.0)
        positive("telemetry_interval_s", self.telemetry_interval_s, 3600.0)
        positive("trainer_gone_grace_s", self.trainer_gone_grace_s, 3600.0)
        if self.resume_at is not None:
            check(
                type(self.resume_at) is int
                and (self.resume_at == 0 or self.rounds.window < self.resume_at < 1 << 62),
                "resume_at",
                self.resume_at,
                f"an iteration: 0, or more than rounds.window ({self.rounds.window})",
            )
        check(
            self.non_finite in ("reject_link", "drop_payload"),
            "non_finite",
            self.non_finite,
            "reject_link (close the sender's connection) or drop_payload (count it as empty, report it)",
        )

    def _check_rates(self) -> None:
        check(self.links in ("all", "plan"), "links", self.links, "'all' (full mesh) or 'plan'")
        check(0.0 < self.link_rate_bps <= 1e13, "link_rate_bps", self.link_rate_bps, "in (0, 1e13] bit/s")
        check(0.0 < self.pacer_burst_s <= 1.0, "pacer_burst_s", self.pacer_burst_s, "in (0, 1] seconds")
        check(
            isinstance(self.tcp_congestion, str)
            and (self.tcp_congestion == "" or bool(CONGESTION_NAME.fullmatch(self.tcp_congestion))),
            "tcp_congestion",
            self.tcp_congestion,
            '"" (the host\'s default) or a kernel congestion control name such as "cubic" or "bbr"',
        )
        for name, rate in self.peer_rates_bps.items():
            key = f"peer_rates_bps.{name}"
            check(name in self.peers, key, name, "not one of the peers")
            check(0.0 < rate <= 1e13, key, rate, "must be in (0, 1e13] bit/s")
        for name in self.shaping:
            check(name in self.peers, f"shaping.{name}", name, "not one of the peers")
            check(
                parse_url(self.peers[name]).shape is None,
                f"shaping.{name}",
                name,
                "the peer's url already carries a shaping query; use one or the other",
            )

    def base_rate_bps(self, peer: str) -> float:
        """The rate the allocator returns to once ``peer``'s link stops straggling."""
        if peer not in self.peers:
            raise ConfigError(f"unknown peer {peer!r}", key="peers", value=peer)
        return float(self.peer_rates_bps.get(peer, self.link_rate_bps))

    def base_rates_bps(self) -> dict[str, float]:
        return {p: self.base_rate_bps(p) for p in self.peers}

    def control_token(self) -> str | None:
        if self.control_token_file is None:
            return None
        return read_secret_file(self.control_token_file, "gateway.control_token_file").decode()

    def secret_bytes(self) -> bytes:
        """The job secret; read from ``secret_file`` (trailing newline stripped) at each call."""
        if self.secret is not None:
            return self.secret.encode()
        if self.secret_file is None:
            raise ConfigError(
                "this gateway uses per-site keys (keys_file), not one job secret", key="keys_file"
            )
        return read_secret_file(self.secret_file, "gateway.secret_file")

    def credentials(self) -> Credentials:
        """What this gateway proves with: per-site keys from ``keys_file``, else the one job secret."""
        if self.keys_file is not None:
            return load_keys_file(self.keys_file, job=self.job, site=self.site, key="gateway.keys_file")
        return Credentials(shared=self.secret_bytes())


def _resolve(base: Path, value: str) -> str:
    p = Path(value).expanduser()
    return str(p if p.is_absolute() else (base / p).resolve())


def _existing(base: Path, value: str, key: str, what: str) -> str:
    resolved = _resolve(base, value)
    if not Path(resolved).is_file():
        raise ConfigError(f"{what} not found: {resolved}", key=key, value=value)
    return resolved


def load_gateway_config(path: str | Path) -> GatewayConfig:
    """Load and validate a site file; secret, TLS and trace paths are taken relative to the file.

    The secret is read once here so that a missing or short secret file fails at start-up, not at the
    first handshake; TLS and trace files must exist.
    """
    p = Path(path)
    data = load_toml(p)
    unknown = sorted(set(data) - {"gateway"})
    if unknown:
        raise ConfigError(f"unknown top-level table {unknown[0]!r}; expected [gateway]", key=unknown[0])
    if "gateway" not in data:
        raise ConfigError(f"{p}: missing [gateway] table", key="gateway", path=str(p))
    table = data["gateway"]
    tls: TLSConfig | None = None
    if isinstance(table, Mapping) and "tls" in table:
        # built on its own so an error names gateway.tls.<key> (the Optional wrapper would hide the key)
        table = {k: v for k, v in table.items() if k != "tls"}
        tls = from_mapping(TLSConfig, data["gateway"]["tls"], section="gateway.tls")
    cfg = from_mapping(GatewayConfig, table, section="gateway")
    base = p.resolve().parent
    changes: dict[str, Any] = {}
    if cfg.secret_file is not None:
        changes["secret_file"] = _resolve(base, cfg.secret_file)
    if cfg.keys_file is not None:
        changes["keys_file"] = _resolve(base, cfg.keys_file)
    if cfg.control_token_file is not None:
        changes["control_token_file"] = _resolve(base, cfg.control_token_file)
    if cfg.state_file is not None:
        changes["state_file"] = _resolve(base, cfg.state_file)
    if tls is not None:
        files: dict[str, Any] = {
            name: _existing(base, value, f"gateway.tls.{name}", f"TLS {name}")
            for name in ("certfile", "keyfile", "cafile")
            if (value := getattr(tls, name)) is not None
        }
        changes["tls"] = dataclasses.replace(tls, **files)
    shaping = {}
    for name, shape in cfg.shaping.items():
        if shape.trace is not None:
            trace = _existing(base, shape.trace, f"gateway.shaping.{name}.trace", "trace file")
            shape = dataclasses.replace(shape, trace=trace)
        shaping[name] = shape
    changes["shaping"] = shaping
    cfg = dataclasses.replace(cfg, **changes)
    cfg.credentials()
    return cfg
