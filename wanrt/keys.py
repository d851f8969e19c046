"""Per-site credentials: which secret proves what, so that holding one key does not let you be anyone.

With one job secret shared by every gateway and trainer, whoever holds any trainer's key can act as any
site's gateway (reliability item 9). A *keys file* instead gives each site only what its place needs,
each derived from a job master key that stays with whoever ran ``wanrt job init``:

- ``trainer``: proves "the trainer of site S" to S's gateway (HMAC(master, trainer|job|S));
- ``peers[P]``: the key of the gateway pair {S, P} (HMAC(master, gateway|job|min|max)): only S and P hold
  it, so a third site cannot act as S towards P, and a trainer's key cannot act as a gateway at all;
- ``scheduler``: proves "the gateway of site S" to the scheduler, whose own keys file holds one such key
  per site (``sites``).

Keys are 64 hex characters, used as the protocol's HMAC secret unchanged; the handshake is the same.
Rotation: write new keys from a new master (``wanrt job init --keys-only --dir SAME``) and restart the
gateways and the scheduler (a gateway only proves with the keys it loaded at start). Sans-IO except for
the explicit file reads/writes below.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from wanrt.errors import ConfigError

__all__ = [
    "FORMAT",
    "TRAINER_KEY_HEADER",
    "Credentials",
    "derive",
    "load_keys_file",
    "site_keys",
    "trainer_key_file_text",
    "trainer_key_owner",
    "write_keys_file",
    "write_private",
]

FORMAT: Final = "wanrt-keys-1"
#: a keys file is small: read at most this much (a wrong path may name a huge file)
MAX_KEYS_FILE_BYTES: Final = 1 << 20
_HEX64: Final = re.compile(r"^[0-9a-f]{64}$")


#: First line of a trainer secret file written by ``wanrt job init``: whose key it is, so that a trainer
#: started with another site's key fails at ``wanrt.init`` naming that site, instead of a "wrong job
#: secret" from the gateway (issue 21). The key itself is the file's last line.
TRAINER_KEY_HEADER: Final = "# wanrt trainer key"
_OWNER: Final = re.compile(r"^# wanrt trainer key site=(\S+) job=(\S+)")


def trainer_key_file_text(site: str, job: str, key: str) -> str:
    """The content of a site's trainer secret file: the owner line, then the key."""
    return f"{TRAINER_KEY_HEADER} site={site} job={job} (give it to this site's trainers only)\n{key}\n"


def trainer_key_owner(text: bytes) -> tuple[str, str] | None:
    """(site, job) named by a trainer secret file's owner line; None for a bare secret (any file)."""
    first = text.split(b"\n", 1)[0].decode("utf-8", "replace").strip()
    m = _OWNER.match(first)
    return (m.group(1), m.group(2)) if m else None


def derive(master: bytes, job: str, purpose: str, *sites: str) -> bytes:
    """The key for ``purpose`` among ``sites`` (order-free for a pair), as 64 hex bytes."""
    label = "|".join(("wanrt-key", job, purpose, *sorted(sites)))
    return hmac.new(master, label.encode(), hashlib.sha256).hexdigest().encode()


@dataclass(frozen=True)
class Credentials:
    """The secrets one process proves with. ``shared``: the single job secret (every role, old style);
    otherwise the per-site keys of the module docstring."""

    shared: bytes | None = field(default=None, repr=False)
    trainer: bytes | None = field(default=None, repr=False)
    scheduler: bytes | None = field(default=None, repr=False)
    peers: Mapping[str, bytes] = field(default_factory=dict, repr=False)
    #: the scheduler's side: one key per site
    sites: Mapping[str, bytes] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "peers", MappingProxyType(dict(self.peers)))
        object.__setattr__(self, "sites", MappingProxyType(dict(self.sites)))

    @property
    def per_site(self) -> bool:
        return self.shared is None

    def for_trainer(self) -> bytes:
        key = self.shared if self.shared is not None else self.trainer
        if key is None:
            raise ConfigError("the keys file holds no trainer key", key="keys_file")
        return key

    def for_peer(self, site: str) -> bytes | None:
        """The key shared with gateway ``site`` (None: it is not one of ours)."""
        return self.shared if self.shared is not None else self.peers.get(site)

    def for_scheduler(self) -> bytes:
        key = self.shared if self.shared is not None else self.scheduler
        if key is None:
            raise ConfigError("the keys file holds no scheduler key", key="keys_file")
        return key

    def for_site(self, site: str) -> bytes | None:
        """The scheduler's side: the key gateway ``site`` proves with (None: not a site of the job)."""
        return self.shared if self.shared is not None else self.sites.get(site)

    def placeholder(self) -> bytes:
        """A valid key to build a server connection with before the peer has named itself (replaced in
        ``Connection.accept``; it never proves anything)."""
        for key in (self.shared, self.trainer, self.scheduler, *self.peers.values(), *self.sites.values()):
            if key is not None:
                return key
        raise ConfigError("the keys file holds no key", key="keys_file")


def site_keys(
    master: bytes, job: str, sites: Iterable[str]
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """The keys-file contents of every site and of the scheduler."""
    names = sorted(set(sites))
    per_site = {
        s: {
            "format": FORMAT,
            "job": job,
            "site": s,
            "trainer": derive(master, job, "trainer", s).decode(),
            "scheduler": derive(master, job, "scheduler", s).decode(),
            "peers": {p: derive(master, job, "gateway", s, p).decode() for p in names if p != s},
        }
        for s in names
    }
    scheduler = {
        "format": FORMAT,
        "job": job,
        "site": "",
        "sites": {s: derive(master, job, "scheduler", s).decode() for s in names},
    }
    return per_site, scheduler


def write_private(path: Path, text: str) -> Path:
    """Write ``text`` readable by its owner only (created with mode 600: never world-readable, even for a
    moment), for secrets, tokens and keys."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(path, 0o600)  # an existing file keeps its mode through O_CREAT
    return path


def write_keys_file(path: Path, content: Mapping[str, Any]) -> Path:
    """A keys file (JSON), readable by the owner only."""
    return write_private(path, json.dumps(content, indent=1, sort_keys=True) + "\n")


def load_keys_file(path_text: str, *, job: str, site: str | None, key: str = "keys_file") -> Credentials:
    """A keys file for ``site`` of ``job`` (``site=None``: the scheduler's), checked entry by entry."""
    path = Path(path_text)
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_KEYS_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read keys_file {str(path)!r}: {exc.strerror}", key=key) from None
    if len(raw) > MAX_KEYS_FILE_BYTES:
        raise ConfigError(f"keys_file {str(path)!r} is larger than {MAX_KEYS_FILE_BYTES} bytes", key=key)
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"keys_file {str(path)!r} is not JSON: {exc}", key=key) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigError(f"keys_file {str(path)!r} is not a {FORMAT} file", key=key)
    if data.get("job") != job:
        raise ConfigError(f"keys_file {str(path)!r} is for job {data.get('job')!r}, not {job!r}", key=key)
    if data.get("site", "") != (site or ""):
        raise ConfigError(
            f"keys_file {str(path)!r} is for site {data.get('site')!r}, not {site or 'the scheduler'!r}",
            key=key,
        )

    def one(name: str, value: Any) -> bytes:
        if not isinstance(value, str) or not _HEX64.match(value):
            raise ConfigError(f"keys_file {str(path)!r}: {name} must be 64 hex characters", key=key)
        return value.encode()

    def table(name: str) -> dict[str, bytes]:
        value = data.get(name, {})
        if not isinstance(value, dict):
            raise ConfigError(f"keys_file {str(path)!r}: {name} must be a table", key=key)
        return {str(k): one(f"{name}.{k}", v) for k, v in value.items()}

    if site is None:
        return Credentials(sites=table("sites"))
    return Credentials(
        trainer=one("trainer", data.get("trainer")),
        scheduler=one("scheduler", data.get("scheduler")),
        peers=table("peers"),
    )
