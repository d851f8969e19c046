"""Writing a local job: what `wanrt job init` puts in its directory.

Every value is validated by loading the written files back with the daemons' own loaders, so a job that
`wanrt job init` writes is one `wanrt gateway` and `wanrt scheduler` accept.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateways.config import load_gateway_config
from scheduler.daemon_config import load_scheduler_config
from wanrt.demo.sites.config_files import toml_text
from wanrt.errors import ConfigError
from wanrt.keys import site_keys, trainer_key_file_text, write_keys_file, write_private

__all__ = ["JobFiles", "write_job", "write_keys"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


@dataclass(frozen=True)
class JobFiles:
    directory: Path
    #: the one job secret (``keys="shared"``), else None: every site has its own keys (wanrt.keys)
    secret: Path | None
    control_token: Path
    gateways: dict[str, Path]  # site -> its gateway config
    trainer_urls: dict[str, str]  # site -> where its trainers connect (wanrt.init(gateway=...))
    scheduler: Path | None
    #: site -> the secret file its trainers pass (wanrt.init(secret_file=...))
    trainer_secrets: dict[str, Path]
    #: daemon -> its /status URL ("scheduler" and each site): every daemon gets a metrics port, so
    #: ``curl .../status`` works without editing a file (issue 21)
    status_urls: dict[str, str]


#: sun_path is 108 bytes on Linux, one of them the terminating NUL
_UNIX_PATH_MAX = 107


def write_job(
    directory: Path,
    *,
    job: str,
    sites: list[str],
    base_port: int = 7700,
    host: str = "127.0.0.1",
    with_scheduler: bool = True,
    topology: str = "tree",
    keys: str = "per-site",
    rounds: Mapping[str, Any] | None = None,
) -> JobFiles:
    """Write the job's files into ``directory`` (created); ConfigError names a bad setting.

    ``keys="per-site"`` (default): each site gets only its own keys (:mod:`wanrt.keys`: a trainer key, the
    key of each gateway pair, its key at the scheduler), so one leaked trainer key cannot act as a
    gateway or as another site; ``"shared"``: one job secret for everyone. ``rounds``: more
    ``[gateway.rounds]`` keys for every gateway (checked by the daemon's own validation below)."""
    if keys not in ("per-site", "shared"):
        raise ConfigError("keys is 'per-site' or 'shared'", key="keys", value=keys)
    if not _NAME.match(job):
        raise ConfigError("job names are letters, digits, _ . - (max 63)", key="job", value=job)
    if len(sites) < 1 or len(set(sites)) != len(sites) or not all(_NAME.match(s) for s in sites):
        raise ConfigError("sites must be distinct names of letters, digits, _ . -", key="sites", value=sites)
    if not 1024 <= base_port <= 65535 - 2 * len(sites) - 2:
        raise ConfigError("base port out of range", key="base_port", value=base_port)
    directory.mkdir(parents=True, exist_ok=True)
    secret: Path | None = None
    if keys == "shared":
        secret = write_private(directory / "job.secret", secrets.token_hex(32) + "\n")
        credentials = {s: {"secret_file": secret.name} for s in sites}
        trainer_secrets = {s: secret for s in sites}
        sched_credential = {"secret_file": secret.name}
    else:
        site_files, sched_file, trainer_secrets = write_keys(directory, job=job, sites=sites)
        credentials = {s: {"keys_file": str(f.relative_to(directory))} for s, f in site_files.items()}
        sched_credential = {"keys_file": str(sched_file.relative_to(directory))}
    token = write_private(directory / "control.token", secrets.token_hex(24) + "\n")
    ports = {s: base_port + i for i, s in enumerate(sorted(sites))}
    scheduler_url = f"tcp://{host}:{base_port + len(sites)}"
    # ports: the gateways' links, the scheduler, then the metrics (/status) of the scheduler and each site
    sched_metrics = base_port + len(sites) + 1
    metrics = {s: sched_metrics + 1 + i for i, s in enumerate(sorted(sites))}
    status_urls: dict[str, str] = {}
    gateways: dict[str, Path] = {}
    trainer_urls: dict[str, str] = {}
    for site in sorted(sites):
        # the base port is in the name because it is what two jobs on one host must already differ in (their
        # TCP ports): two runs of one job name at different ports no longer race for the same socket
        sock = f"/tmp/wanrt-{job}-{base_port}-{site}.sock"
        if len(sock.encode()) > _UNIX_PATH_MAX:
            raise ConfigError(
                f"the trainer socket path {sock!r} is longer than a unix socket allows"
                f" ({_UNIX_PATH_MAX} bytes): use shorter job or site names",
                key="sites",
                value=site,
            )
        trainer_url = f"unix://{sock}"
        gateway: dict[str, Any] = {
            "site": site,
            "job": job,
            **credentials[site],
            "listen": f"tcp://{host}:{ports[site]}",
            "trainer_listen": trainer_url,
            "control_token_file": token.name,
            "state_file": f"state-{site}.json",  # gateways restarted together resume the job
            "metrics_port": metrics[site],
        }
        if with_scheduler:
            gateway["scheduler"] = scheduler_url
        tables: dict[str, dict[str, Any]] = {
            "gateway": gateway,
            "gateway.peers": {p: f"tcp://{host}:{ports[p]}" for p in sorted(sites) if p != site},
            "gateway.rounds": {"topology": topology, **(rounds or {})},
        }
        path = directory / f"gw-{site}.toml"
        path.write_text(toml_text(tables))
        load_gateway_config(path)  # the daemon's own validation
        gateways[site] = path
        trainer_urls[site] = trainer_url
        status_urls[site] = f"http://{host}:{metrics[site]}/status"
    sched: Path | None = None
    if with_scheduler:
        sched = directory / "job.toml"
        sched.write_text(
            toml_text(
                {
                    "scheduler": {
                        "job": job,
                        "sites": sorted(sites),
                        **sched_credential,
                        "listen": scheduler_url,
                        "control_token_file": token.name,
                        "metrics_port": sched_metrics,
                    }
                }
            )
        )
        load_scheduler_config(sched)
        status_urls = {"scheduler": f"http://{host}:{sched_metrics}/status", **status_urls}
    return JobFiles(directory, secret, token, gateways, trainer_urls, sched, trainer_secrets, status_urls)


def write_keys(
    directory: Path, *, job: str, sites: list[str]
) -> tuple[dict[str, Path], Path, dict[str, Path]]:
    """Per-site keys from a fresh master (also how keys are rotated: call again, restart the daemons).

    Writes ``keys/<site>.json`` (the site's gateway), ``keys/<site>.trainer`` (its trainers' secret file),
    ``keys/scheduler.json`` and ``job.master`` (keep it offline: only needed to add a site later), all
    mode 600. Returns (site -> gateway keys file, scheduler keys file, site -> trainer secret file)."""
    master = secrets.token_bytes(32)
    write_private(directory / "job.master", master.hex() + "\n")
    kdir = directory / "keys"
    kdir.mkdir(mode=0o700, exist_ok=True)
    per_site, sched = site_keys(master, job, sites)
    site_files = {s: write_keys_file(kdir / f"{s}.json", content) for s, content in per_site.items()}
    trainers = {
        s: write_private(kdir / f"{s}.trainer", trainer_key_file_text(s, job, content["trainer"]))
        for s, content in per_site.items()
    }
    return site_files, write_keys_file(kdir / "scheduler.json", sched), trainers
