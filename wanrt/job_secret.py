"""The job secret of a daemon's config file: exactly one of a keys file, a secret file or an inline secret,
and a secret file read with a bound.

Both daemons (``[gateway]`` and ``[scheduler]`` tables) accept the same three choices with the same rules, so
the rules live once, on the ground floor, where neither daemon has to import the other to share them. The
length bounds are the protocol's (:data:`~wanrt.protocol.limits.MIN_SECRET_BYTES`,
:data:`~wanrt.protocol.limits.MAX_SECRET_BYTES`): a secret the handshake would refuse is refused at start-up.
"""

from __future__ import annotations

from pathlib import Path

from wanrt.config import check
from wanrt.errors import ConfigError
from wanrt.protocol.limits import MAX_SECRET_BYTES, MIN_SECRET_BYTES

__all__ = ["check_secret_choice", "read_secret_file"]


def check_secret_choice(secret: str | None, secret_file: str | None, keys_file: str | None = None) -> None:
    """Exactly one of ``keys_file`` (per-site keys, :mod:`wanrt.keys`), ``secret_file`` or an inline
    ``secret`` of the protocol's length bounds."""
    check(
        sum(x is not None for x in (secret, secret_file, keys_file)) == 1,
        "secret_file",
        secret_file,
        "set exactly one of keys_file (per-site keys), secret_file or secret",
    )
    check(keys_file != "", "keys_file", keys_file, "must be a file path")
    if secret is not None:
        check(
            MIN_SECRET_BYTES <= len(secret.encode()) <= MAX_SECRET_BYTES,
            "secret",
            "<hidden>",
            f"must hold {MIN_SECRET_BYTES}..{MAX_SECRET_BYTES} bytes",
        )
    check(secret_file != "", "secret_file", secret_file, "must be a file path")


def read_secret_file(path_text: str, key: str) -> bytes:
    """A job secret from a file (trailing newline stripped), read bounded: a wrong path may be huge."""
    path = Path(path_text)
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_SECRET_BYTES + 3).rstrip(b"\r\n")
    except OSError as exc:
        raise ConfigError(f"cannot read secret_file {str(path)!r}: {exc.strerror}", key=key) from None
    if not MIN_SECRET_BYTES <= len(data) <= MAX_SECRET_BYTES:
        raise ConfigError(
            f"secret_file {str(path)!r} must hold {MIN_SECRET_BYTES}..{MAX_SECRET_BYTES} bytes", key=key
        )
    return data
