"""``wanrt.init()``: the first of the few lines a trainer adds.

It only prepares: finds (or creates) the site's process group, reads the job secret on the site leader and
validates the configuration. The gateway connection is opened when the optimizer binds the model, because
the handshake carries the model's layer signature, so a model that differs between sites is refused up
front instead of silently training garbage.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch.distributed as dist

from wanrt.client.config import ClientConfig
from wanrt.client.context import Context
from wanrt.client.link.api import LinkFactory
from wanrt.client.site.process_group import comm_device, ensure_process_group
from wanrt.errors import ConfigError
from wanrt.keys import trainer_key_owner

__all__ = ["init", "read_secret"]

#: a job secret file is a short key, not a data file; refuse to read anything bigger
MAX_SECRET_FILE_BYTES = 4096


def read_secret(path: str | os.PathLike[str], *, site: str | None = None, job: str | None = None) -> bytes:
    """The job secret: the file's bytes without surrounding whitespace (an editor's trailing newline).

    A trainer key file written by ``wanrt job init`` starts with a line naming its site and job
    (:func:`wanrt.keys.trainer_key_owner`): the key is its last line, and given ``site``/``job`` a key of
    another site or job is refused here, naming whose it is (issue 21: a trainer started with site b's key
    at site a learnt only "wrong job secret", from the gateway)."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > MAX_SECRET_FILE_BYTES:
            raise ConfigError(
                f"secret file {p} is {size} bytes; a job secret is at most {MAX_SECRET_FILE_BYTES}",
                key="secret_file",
                path=str(p),
            )
        raw = p.read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"cannot read the job secret file {p}: {exc.strerror}", key="secret_file", path=str(p)
        ) from None
    owner = trainer_key_owner(raw)
    if owner is not None:
        owner_site, owner_job = owner
        if site is not None and owner_site != site:
            raise ConfigError(
                f"secret file {p}: this key belongs to site {owner_site}, and this trainer is site {site}; "
                f"pass site {site}'s trainer key (keys/{site}.trainer of the job directory)",
                key="secret_file",
                path=str(p),
            )
        if job is not None and owner_job != job:
            raise ConfigError(
                f"secret file {p}: this key belongs to job {owner_job!r}, not {job!r}",
                key="secret_file",
                path=str(p),
            )
        raw = raw.strip().rsplit(b"\n", 1)[-1]
    secret = raw.strip()
    if not secret:
        raise ConfigError(f"secret file {p} is empty", key="secret_file", path=str(p))
    return secret


def init(
    gateway: str,
    *,
    site: str,
    job: str,
    secret_file: str | os.PathLike[str] | None = None,
    secret: bytes | None = None,
    config: ClientConfig | None = None,
    group: dist.ProcessGroup | None = None,
    link_factory: LinkFactory | None = None,
    resume_at: int | None = None,
) -> Context:
    """Create this process's wanrt context (call on every rank of every site, before building the optimizer).

    ``gateway`` is the site gateway's URL (``unix:///run/wanrt/a.sock`` or ``tcp://host:port``); ``site``
    and ``job`` name this site and the job (the same job name and secret at every site). ``group`` is the
    site's process group; by default torch.distributed's default group, initialised from torchrun's
    environment variables if nobody did yet. ``link_factory`` replaces the network link (tests).
    ``resume_at`` is the iteration of the checkpoint this run resumes from (``opt.state_dict()
    ["iteration"]``; docs/client.md, "Checkpoint and resume"): the gateways let it in only where the job
    stopped, and training continues there.

    The site leader looks at its gateway at once (:mod:`wanrt.client.link.probe`): an unreachable
    gateway, a wrong key, or gateways that serve another run of the job are refused here, on every rank,
    with one message, before a model is built.
    """
    if resume_at is not None and (type(resume_at) is not int or resume_at < 0):
        raise ConfigError("resume_at must be an iteration (an int >= 0)", key="resume_at", value=resume_at)
    if not site:
        raise ConfigError("site name must not be empty", key="site")
    if not job:
        raise ConfigError("job name must not be empty", key="job")
    if not gateway:
        raise ConfigError("gateway URL must not be empty", key="gateway")
    if (secret is None) == (secret_file is None):
        raise ConfigError("pass exactly one of secret_file= or secret=", key="secret_file")
    cfg = config if config is not None else ClientConfig()
    created = ensure_process_group()
    rank = dist.get_rank(group)
    key: bytes | None = None
    if rank == 0:
        key = secret if secret is not None else read_secret(secret_file, site=site, job=job)  # type: ignore[arg-type]
    real = link_factory is None
    if link_factory is None:
        from wanrt.client.link.gateway_link import open_gateway_link

        link_factory = open_gateway_link
    ctx = Context(
        gateway=gateway,
        site=site,
        job=job,
        secret=key,
        config=cfg,
        group=group,
        link_factory=link_factory,
        device=comm_device(group),
        owns_group=created and group is None,
        resume_at=resume_at,
    )
    ctx.check_gateway(probe=real)
    return ctx
