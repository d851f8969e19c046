"""Field validators shared by every message schema.

Each raises :class:`LocalProtocolError` (we built a bad message). The decoder turns those into
:class:`RemoteProtocolError` / :class:`LimitExceeded` naming the peer, so one set of rules serves both
directions and a value we refuse to send is exactly a value we refuse to receive.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Final

from wanrt.errors import LocalProtocolError
from wanrt.protocol.limits import MAX_BIN_BYTES, MAX_NAME_CHARS, MAX_STR_CHARS

__all__ = [
    "InfoValue",
    "check_bytes",
    "check_count",
    "check_float",
    "check_name",
    "check_names",
    "check_scalar_map",
    "check_text",
    "check_uint",
    "too_many",
]

#: A value allowed in the small maps (info, config values): plain scalars only, so they hash, compare and
#: serialise canonically (the handshake proof covers the info maps).
InfoValue = int | float | str | bytes | bool

#: Identifiers end up in logs, metric labels and file names: keep them boring.
_NAME_RE: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@+-]*")


def too_many(what: str, limit_name: str, limit: int, value: int) -> LocalProtocolError:
    """The error for a count over a named limit; the decoder maps it to :class:`LimitExceeded`."""
    return LocalProtocolError(
        f"{what}: {value} exceeds {limit_name}={limit}", name=limit_name, limit=limit, value=value
    )


def check_uint(value: Any, field: str, maximum: int) -> int:
    if type(value) is int and 0 <= value <= maximum:  # the common case, one test (bool is not int)
        return value
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= maximum:
        raise LocalProtocolError(f"{field} must be an integer in [0, {maximum}]", value=value)
    return value


def check_float(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise LocalProtocolError(f"{field} must be a finite number", value=value)
    return float(value)


def check_text(value: Any, field: str, max_chars: int = MAX_STR_CHARS) -> str:
    if not isinstance(value, str):
        raise LocalProtocolError(f"{field} must be a string", value=type(value).__name__)
    if len(value) > max_chars:
        raise too_many(f"{field} length", "MAX_STR_CHARS", max_chars, len(value))
    return str(value)


#: Names that already passed :func:`check_name` (a job has a few of them; a 1 000-site round result lists
#: every one in each message, and the regex per name was a fifth of a simulated gateway's CPU). Bounded:
#: cleared when full, so a flood of distinct names costs only re-checks, never memory.
_GOOD_NAMES: set[str] = set()
_GOOD_NAMES_MAX = 4096
_STR_ONLY: frozenset[type] = frozenset({str})
_LAST_NAMES: tuple[str, ...] | None = None


def check_name(value: Any, field: str) -> str:
    if type(value) is str and value in _GOOD_NAMES:
        return value
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME_CHARS or not _NAME_RE.fullmatch(value):
        raise LocalProtocolError(
            f"{field} must be 1-{MAX_NAME_CHARS} chars of [A-Za-z0-9_.:@+-], not starting with punctuation",
            value=value if isinstance(value, str) and len(value) <= MAX_STR_CHARS else type(value).__name__,
        )
    name = str(value)
    if len(_GOOD_NAMES) >= _GOOD_NAMES_MAX:
        _GOOD_NAMES.clear()
    _GOOD_NAMES.add(name)
    return name


def check_names(values: Any, field: str) -> tuple[str, ...]:
    """:func:`check_name` for each of ``values`` (a sequence), with a set-level fast path for names already
    seen: a 1 000-site result lists every site in each message."""
    global _LAST_NAMES
    names = tuple(values)
    if names is _LAST_NAMES:  # the very tuple checked last (immutable): a result's site list, per delivery
        return names
    if _GOOD_NAMES.issuperset(names) and set(map(type, names)) <= _STR_ONLY:  # C loops, no generator
        _LAST_NAMES = names
        return names
    return tuple(check_name(n, field) for n in names)


def check_bytes(value: Any, field: str, *, exact: int | None = None, max_len: int = MAX_BIN_BYTES) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise LocalProtocolError(f"{field} must be bytes", value=type(value).__name__)
    out = bytes(value)
    if exact is not None and len(out) != exact:
        raise LocalProtocolError(f"{field} must be exactly {exact} bytes", value=len(out))
    if len(out) > max_len:
        raise too_many(f"{field} length", "MAX_BIN_BYTES", max_len, len(out))
    return out


def check_count(n: int, what: str, limit_name: str, limit: int) -> None:
    if n > limit:
        raise too_many(what, limit_name, limit, n)


def check_scalar_map(
    value: Any,
    field: str,
    limit_name: str,
    limit: int,
    *,
    numbers_only: bool = False,
    allow_bytes: bool = False,
) -> dict[str, Any]:
    """A flat map of name -> scalar, bounded in size; returns a private copy (messages are immutable).

    ``numbers_only`` maps store every value as a finite float (metrics); otherwise bool, 64-bit int, finite
    float, str and (with ``allow_bytes``) bytes are kept as they are.
    """
    if not isinstance(value, Mapping):
        raise LocalProtocolError(f"{field} must be a map", value=type(value).__name__)
    check_count(len(value), f"{field} entries", limit_name, limit)
    out: dict[str, Any] = {}
    for key, item in value.items():
        check_name(key, f"{field} key")
        where = f"{field}[{key!r}]"
        if numbers_only:
            out[key] = check_float(item, where)
        elif isinstance(item, bool):
            out[key] = item
        elif isinstance(item, int):
            if not -(2**63) <= item < 2**64:
                raise LocalProtocolError(f"{where} does not fit 64 bits", value=item)
            out[key] = item
        elif isinstance(item, float):
            out[key] = check_float(item, where)
        elif isinstance(item, str):
            out[key] = check_text(item, where)
        elif allow_bytes and isinstance(item, (bytes, bytearray, memoryview)):
            out[key] = check_bytes(item, where)
        else:
            raise LocalProtocolError(f"{where} has unsupported type", value=type(item).__name__)
    return out
