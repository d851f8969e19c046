"""Settings of the job's scheduler daemon (``wanrt scheduler --config job.toml``, table ``[scheduler]``).

One scheduler per job. Every gateway names it in its own config (``[gateway] scheduler = "tcp://…"``) and
dials it with the job secret; the scheduler accepts only the sites listed here.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from scheduler.control.config import SchedulerConfig
from scheduler.control.mode_config import ModeConfig
from scheduler.sharding.config import ShardingConfig
from scheduler.stragglers.site_config import SiteStragglerConfig
from transports.timeouts import Timeouts
from transports.urls import parse_url
from wanrt.config import check, from_mapping, load_toml
from wanrt.errors import ConfigError
from wanrt.job_secret import check_secret_choice, read_secret_file
from wanrt.keys import Credentials, load_keys_file
from wanrt.protocol.limits import MAX_SITES

__all__ = ["POLICIES", "SchedulerDaemonConfig", "load_scheduler_config"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")

#: ``policy``: "adaptive" runs StellaTrain's controller (scheduler.control) on the gateways' telemetry;
#: "fixed" changes settings only on request (POST /config); "stragglers" runs AntDT's ADJUST_BS across sites
#: (scheduler.stragglers.daemon_policy: persistent straggler sites get Eq. 3's batch split).
POLICIES: Final = ("adaptive", "fixed", "stragglers")


@dataclass(frozen=True)
class SchedulerDaemonConfig:
    """The ``[scheduler]`` table.

    * ``announce_margin`` — a decision takes effect this many iterations past the newest frontier any
      gateway reported: enough for a prepare and a commit to reach every gateway (two round trips) before
      the fastest trainer gets there. A gateway that finds it too close refuses, and the scheduler prepares
      again further ahead.
    * ``decide_interval_s`` — how often the policy is asked for new settings.
    * ``reply_timeout_s`` — a prepare not answered by every connected gateway within this is aborted.
    * ``control_token_file`` — the token ``POST /config`` must present (unset: no changes over HTTP).
    * ``profile`` — the convergence profile ḡ(r, Σx) written by ``wanrt profile`` (JSON); without one the
      adaptive policy uses the analytic stand-in :class:`~scheduler.control.convergence.PowerLawConvergence`.
    * ``[scheduler.control]`` — the controller's knobs (:class:`~scheduler.control.config.SchedulerConfig`).
    * ``[scheduler.stragglers]`` — the ``stragglers`` policy's windows, λ and Eq. 3 bounds
      (:class:`~scheduler.stragglers.site_config.SiteStragglerConfig`).
    * ``[scheduler.mode]`` — the exchange-mode choice (per-step, DiLoCo, streaming; off by default; with
      the ``adaptive`` policy only): :class:`~scheduler.control.mode_config.ModeConfig`.
    * ``[scheduler.sharding]`` — the data-shard service (:class:`~scheduler.sharding.config.ShardingConfig`).
    """

    job: str
    sites: tuple[str, ...]
    secret: str | None = field(default=None, repr=False)
    secret_file: str | None = None
    keys_file: str | None = None
    control_token_file: str | None = None
    listen: str = "tcp://127.0.0.1:7800"
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 0
    policy: str = "adaptive"
    profile: str | None = None
    control: SchedulerConfig = field(default_factory=SchedulerConfig)
    stragglers: SiteStragglerConfig = field(default_factory=SiteStragglerConfig)
    mode: ModeConfig = field(default_factory=ModeConfig)
    sharding: ShardingConfig = field(default_factory=ShardingConfig)
    announce_margin: int = 8
    decide_interval_s: float = 5.0
    reply_timeout_s: float = 10.0
    timeouts: Timeouts = field(default_factory=Timeouts)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sites", tuple(self.sites))
        check(bool(_NAME.match(self.job)), "job", self.job, "letters, digits, _ . - (max 63)")
        check(1 <= len(self.sites) <= MAX_SITES, "sites", len(self.sites), f"1..{MAX_SITES} site names")
        check(len(set(self.sites)) == len(self.sites), "sites", self.sites, "names must be distinct")
        for s in self.sites:
            check(isinstance(s, str) and bool(_NAME.match(s)), "sites", s, "letters, digits, _ . - (max 63)")
        check_secret_choice(self.secret, self.secret_file, self.keys_file)
        try:
            parse_url(self.listen)
        except ConfigError as exc:
            raise ConfigError(f"invalid value for 'listen': {exc.message}", key="listen") from None
        check(0 <= self.metrics_port <= 65535, "metrics_port", self.metrics_port, "0 (off) or a port")
        check(self.policy in POLICIES, "policy", self.policy, f"one of {', '.join(POLICIES)}")
        # the mode choice reads the adaptive policy's bandwidth estimate (docs/scheduler.md "The mode choice")
        check(
            not self.mode.enabled or self.policy == "adaptive", "mode", "enabled", 'needs policy = "adaptive"'
        )
        check(1 <= self.announce_margin <= 10_000, "announce_margin", self.announce_margin, "1..10000")
        for key in ("decide_interval_s", "reply_timeout_s"):
            value = getattr(self, key)
            check(0.0 < value <= 3600.0, key, value, "must be in (0, 3600] seconds")

    def control_token(self) -> str | None:
        if self.control_token_file is None:
            return None
        return read_secret_file(self.control_token_file, "scheduler.control_token_file").decode()

    def credentials(self) -> Credentials:
        """The one job secret, or per-site keys (``keys_file``: one key per site, :mod:`wanrt.keys`)."""
        if self.keys_file is not None:
            creds = load_keys_file(self.keys_file, job=self.job, site=None, key="scheduler.keys_file")
            missing = sorted(set(self.sites) - set(creds.sites))
            if missing:
                raise ConfigError(f"keys_file has no key for site {missing[0]!r}", key="scheduler.keys_file")
            return creds
        if self.secret is not None:
            return Credentials(shared=self.secret.encode())
        assert self.secret_file is not None
        return Credentials(shared=read_secret_file(self.secret_file, "scheduler.secret_file"))


def load_scheduler_config(path: str | Path) -> SchedulerDaemonConfig:
    """Load and validate ``job.toml``; a relative ``secret_file`` is taken relative to the file."""
    p = Path(path)
    data = load_toml(p)
    unknown = sorted(set(data) - {"scheduler"})
    if unknown:
        raise ConfigError(f"unknown top-level table {unknown[0]!r}; expected [scheduler]", key=unknown[0])
    table: Any = data.get("scheduler")
    if not isinstance(table, Mapping):
        raise ConfigError(f"{p}: missing [scheduler] table", key="scheduler", path=str(p))
    cfg = from_mapping(SchedulerDaemonConfig, table, section="scheduler")
    base = p.resolve().parent

    def resolve(value: str | None) -> str | None:
        if value is None:
            return None
        path = Path(value).expanduser()
        return str(path if path.is_absolute() else (base / path).resolve())

    cfg = dataclasses.replace(
        cfg,
        secret_file=resolve(cfg.secret_file),
        keys_file=resolve(cfg.keys_file),
        control_token_file=resolve(cfg.control_token_file),
        profile=resolve(cfg.profile),
        sharding=dataclasses.replace(cfg.sharding, state_file=resolve(cfg.sharding.state_file)),
    )
    cfg.credentials()
    return cfg
