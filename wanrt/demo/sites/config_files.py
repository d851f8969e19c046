"""The files one demo run needs: the job secret, the fluctuating site's bandwidth trace, a gateway TOML
config per site, in the format of :mod:`gateways.config` (docs/examples/site-a.toml), and for a run with the
scheduler its ``job.toml`` (:mod:`scheduler.daemon_config`), which every gateway's ``scheduler`` names.

Every link is a unix socket (``unix:///tmp/wanrt-XXXX/<run>/gw-a.sock``), so nothing races for ports, and
each gateway shapes what it sends to each peer (``[gateway.shaping.PEER]``: rate, one-way delay = RTT/2,
jitter, and for links that touch the fluctuating site a trace). Both runs of a comparison get identical
configs apart from the job name and the socket directory, so they differ only in the client's mode.
Sockets live under a short directory in /tmp because a unix socket path is limited to 107 bytes, while
configs, logs and stats live in the (possibly long) output directory the user sees.
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from transports.traces import BandwidthTrace
from wanrt.demo.config import DemoConfig, site_names
from wanrt.keys import write_private

__all__ = [
    "SchedulerFiles",
    "SiteFiles",
    "fluctuating_trace",
    "toml_text",
    "trace_in_run",
    "write_run_files",
    "write_scheduler_files",
    "write_secret",
]

#: the gateways' own rate (their pacing and plan) when ``DemoConfig.shaping`` is off: local sockets, no
#: emulated link, so a rate no loopback reaches
UNSHAPED_RATE_BPS: Final = 1e11
#: the trace repeats after this many steps, so a run of any length keeps fluctuating
TRACE_STEPS: Final = 60
#: Gateways dial their peers as soon as they are up, and the peers of one run start within a second or two
#: of each other; the daemon's default backoff (0.5 s, doubling) would leave a link down for seconds after
#: its peer is listening, inside the measured time. Retrying every ≤ 0.5 s brings the WAN mesh up before the
#: trainers finish connecting.
RECONNECT: Final = {"reconnect_initial_s": 0.05, "reconnect_factor": 1.5, "reconnect_max_s": 0.5}
#: a unix socket path must fit sockaddr_un.sun_path (108 bytes with the terminating NUL)
MAX_SOCKET_PATH: Final = 107


@dataclass(frozen=True)
class SiteFiles:
    """Where one site's gateway of one run gets its config and leaves its traces."""

    site: str
    config: Path
    ready: Path
    stats: Path
    log: Path
    listen_url: str
    trainer_url: str


@dataclass(frozen=True)
class SchedulerFiles:
    """Where the scheduler of one run gets its config and leaves its traces."""

    config: Path
    ready: Path
    log: Path
    #: JSON lines of its decisions and bandwidth estimates (``wanrt scheduler --decisions-file``)
    decisions: Path
    listen_url: str


def write_secret(path: Path) -> Path:
    """A fresh random job secret, readable by its owner only (the gateways and site leaders read it)."""
    return write_private(path, secrets.token_hex(32) + "\n")


def fluctuating_trace(cfg: DemoConfig) -> BandwidthTrace:
    """Every ``trace_step_s`` a new rate drawn uniformly from [floor, 1] × bandwidth, reproducible by seed.

    Never above the nominal rate: the fluctuating site is a WAN link that sometimes delivers its contract
    and often less, which is what the scheduler and partial staleness must ride out.
    """
    rng = np.random.default_rng(cfg.seed + 7919)
    factors = cfg.trace_floor + (1.0 - cfg.trace_floor) * rng.random(TRACE_STEPS)
    factors[0] = 1.0  # start at the nominal rate: both runs begin on equal terms
    steps = [(i * cfg.trace_step_s, float(cfg.bandwidth_bps * f)) for i, f in enumerate(factors)]
    return BandwidthTrace.from_pairs(steps, period=TRACE_STEPS * cfg.trace_step_s)


def trace_in_run(trace: BandwidthTrace, offset_s: float, horizon_s: float) -> list[tuple[float, float]]:
    """The rate steps a run saw, as (seconds since the run's start, bit/s), for ``[0, horizon_s]``.

    ``offset_s``: how long the trace had been playing when the run started (gateways start their traces
    when they start, seconds before the trainers begin).
    """
    first = trace.rate_at(max(0.0, offset_s))
    out = [(0.0, float(first if first is not None else trace.steps[0][1]))]
    period = trace.period
    cycle = int(offset_s // period) if period is not None else 0
    while True:
        base = cycle * period if period is not None else 0.0
        for t, bps in trace.steps:
            at = base + t - offset_s
            if at > horizon_s:
                return out
            if at > 0:
                out.append((at, float(bps)))
        if period is None:
            return out
        cycle += 1


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):  # an inline table (``outer_density = {"int2" = 0.03}``)
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def toml_text(tables: Mapping[str, Mapping[str, Any]]) -> str:
    """``{"gateway": {...}, "gateway.peers": {...}}`` -> TOML; table names are dotted paths, in order."""
    lines: list[str] = []
    for name, table in tables.items():
        lines.append(f"[{name}]")
        lines.extend(f"{key} = {_toml_value(value)}" for key, value in table.items())
        lines.append("")
    return "\n".join(lines)


def _check_socket_path(path: Path) -> str:
    text = str(path)
    if len(text.encode()) > MAX_SOCKET_PATH:
        raise ValueError(f"unix socket path too long ({len(text)} > {MAX_SOCKET_PATH} bytes): {text}")
    return f"unix://{text}"


def write_run_files(
    cfg: DemoConfig,
    *,
    job: str,
    run_dir: Path,
    sock_dir: Path,
    secret_file: Path,
    trace_file: Path | None,
    scheduler_url: str | None = None,
    rounds: Mapping[str, Any] | None = None,
) -> list[SiteFiles]:
    """Write ``gw-<site>.toml`` for every site into ``run_dir``; sockets go into ``sock_dir``.

    ``trace_file`` (if given) drives both directions of every link of the last site. With
    ``scheduler_url`` every gateway dials that scheduler and reports every ``cfg.telemetry_interval_s``.
    ``rounds``: more ``[gateway.rounds]`` keys (an outer-loop arm's, :meth:`DemoConfig.outer_rounds`).
    """
    # every path a TOML names is written absolute: the daemons read a relative one relative to the file
    # (issue 21: `wanrt demo --out demo-out` looked for demo-out/dense/demo-out/dense/fluctuating-site.csv)
    run_dir, sock_dir, secret_file = run_dir.resolve(), sock_dir.resolve(), secret_file.resolve()
    trace_file = None if trace_file is None else trace_file.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    sock_dir.mkdir(parents=True, exist_ok=True)
    names = site_names(cfg.sites)
    listen = {s: _check_socket_path(sock_dir / f"gw-{s}.sock") for s in names}
    fluctuating = names[-1] if trace_file is not None else None
    out = []
    for site in names:
        peers = [p for p in names if p != site]
        files = SiteFiles(
            site=site,
            config=run_dir / f"gw-{site}.toml",
            ready=run_dir / f"gw-{site}.ready.json",
            stats=run_dir / f"gw-{site}.stats.json",
            log=run_dir / f"gw-{site}.log",
            listen_url=listen[site],
            trainer_url=_check_socket_path(sock_dir / f"tr-{site}.sock"),
        )
        tables: dict[str, dict[str, Any]] = {
            "gateway": {
                "site": site,
                "job": job,
                "secret_file": str(secret_file),
                "listen": files.listen_url,
                "trainer_listen": files.trainer_url,
                "link_rate_bps": float(cfg.bandwidth_bps if cfg.shaping else UNSHAPED_RATE_BPS),
                **RECONNECT,
                **(
                    {}
                    if scheduler_url is None
                    else {"scheduler": scheduler_url, "telemetry_interval_s": float(cfg.telemetry_interval_s)}
                ),
            },
            "gateway.peers": {p: listen[p] for p in peers},
            "gateway.rounds": {
                "topology": cfg.topology,
                "round_deadline_s": float(cfg.round_deadline_s),
                **(rounds or {}),
            },
        }
        for peer in peers if cfg.shaping else []:
            shape: dict[str, Any] = {
                "rate_bps": float(cfg.bandwidth_bps),
                "delay_s": cfg.rtt_s / 2.0,
                "jitter_s": float(cfg.jitter_s),
            }
            if trace_file is not None and fluctuating in (site, peer):
                shape["trace"] = str(trace_file)
            tables[f"gateway.shaping.{peer}"] = shape
        files.config.write_text(
            f"# wanrt demo: gateway of site {site!r} (written by wanrt.demo.sites.config_files)\n"
            + toml_text(tables)
        )
        out.append(files)
    return out


def write_scheduler_files(
    cfg: DemoConfig,
    *,
    job: str,
    run_dir: Path,
    sock_dir: Path,
    secret_file: Path,
    control: Mapping[str, Any] | None = None,
    policy: str = "adaptive",
    stragglers: Mapping[str, Mapping[str, Any]] | None = None,
    mode: Mapping[str, Any] | None = None,
) -> SchedulerFiles:
    """Write ``scheduler.toml`` (``policy`` over every site) into ``run_dir``.

    ``control`` sets knobs of the controller (``[scheduler.control]``, :class:`SchedulerConfig` fields);
    the demo itself sets none: it runs the controller with its paper defaults. ``stragglers`` holds the
    sub-tables of ``[scheduler.stragglers]`` (``{"detection": {...}, "batch": {...}}``) for the
    ``stragglers`` policy. ``mode`` is ``[scheduler.mode]`` (the exchange-mode choice).
    """
    run_dir, sock_dir, secret_file = run_dir.resolve(), sock_dir.resolve(), secret_file.resolve()  # as above
    run_dir.mkdir(parents=True, exist_ok=True)
    sock_dir.mkdir(parents=True, exist_ok=True)
    files = SchedulerFiles(
        config=run_dir / "scheduler.toml",
        ready=run_dir / "scheduler.ready.json",
        log=run_dir / "scheduler.log",
        decisions=run_dir / "scheduler.decisions.jsonl",
        listen_url=_check_socket_path(sock_dir / "sched.sock"),
    )
    table: dict[str, Any] = {
        "job": job,
        "sites": list(site_names(cfg.sites)),
        "secret_file": str(secret_file),
        "listen": files.listen_url,
        "policy": policy,
        "decide_interval_s": float(cfg.decide_interval_s),
        "announce_margin": int(cfg.announce_margin),
    }
    if cfg.profile is not None:
        table["profile"] = cfg.profile
    tables: dict[str, Mapping[str, Any]] = {"scheduler": table}
    if control:
        tables["scheduler.control"] = dict(control)
    if mode:
        tables["scheduler.mode"] = dict(mode)
    for name, sub_table in (stragglers or {}).items():
        tables[f"scheduler.stragglers.{name}"] = dict(sub_table)
    files.config.write_text(
        "# wanrt demo: the job's scheduler (written by wanrt.demo.sites.config_files)\n" + toml_text(tables)
    )
    return files
