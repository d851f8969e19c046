"""The shard service's snapshot on disk: JSON, replaced atomically so a crash mid-write never leaves half a
file (the old snapshot stays until the new one is complete: temp file in the same folder, fsync, rename).

Why a file at all: the scheduler is one process per job; without it a restart would forget which shards are
DONE and the epoch would be trained again from the start (AntDT §IV-C3: the service keeps each shard's state
so a failover only recomputes the shards in flight).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from wanrt.errors import ConfigError

__all__ = ["read_state", "write_state"]

_KEY = "scheduler.sharding.state_file"


def write_state(path: str | Path, data: dict[str, Any]) -> None:
    """Write ``data`` as JSON to ``path`` atomically (temp file + fsync + rename)."""
    p = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, separators=(",", ":"))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_state(path: str | Path) -> dict[str, Any] | None:
    """The snapshot at ``path``, None if there is none yet; unreadable JSON is a ConfigError."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"cannot read the shard state file {p}: {exc.strerror}", key=_KEY) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"shard state file {p} is not JSON: {exc}", key=_KEY, path=str(p)) from None
    if not isinstance(data, dict):
        raise ConfigError(f"shard state file {p} does not hold a JSON object", key=_KEY, path=str(p))
    return data
