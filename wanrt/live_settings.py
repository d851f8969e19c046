"""The settings a running job may change (density, staleness bound, batch size and the site's share of the
job's samples), and their bounds: one
schema shared by the trainer client, the gateway and the scheduler, so a value one of them accepts is never
refused (or worse, crashes a trainer) at another.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from wanrt.config import check
from wanrt.errors import ConfigError
from wanrt.protocol.limits import MAX_SITES

__all__ = ["LIVE_KEYS", "MAX_BATCH_SIZE", "MAX_STALENESS", "check_live_settings"]

#: Keys a ConfigUpdate may carry for the trainers.
LIVE_KEYS: Final = ("density", "staleness", "batch_size", "batch_weight")

#: StellaTrain §3.3 bounds staleness by 1; a little more is allowed for experiments, but an unbounded value
#: would let a slow site's updates pile up in the leader's memory without limit.
MAX_STALENESS: Final = 4

#: Samples per rank and step; far above any GPU's memory, low enough that a typo is caught.
MAX_BATCH_SIZE: Final = 1 << 20


def check_live_settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` as a plain dict if every key is known and every value in bounds; ConfigError names the
    first bad key."""
    if not values:
        raise ConfigError("no settings given", key="values")
    for key, value in values.items():
        check(key in LIVE_KEYS, key, value, f"settings that can change are {', '.join(LIVE_KEYS)}")
        if key == "density":
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            check(number and 0 < value <= 1, key, value, "a number in (0, 1]")
        elif key == "batch_weight":
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            check(number and 0 < value <= MAX_SITES, key, value, f"a number in (0, {MAX_SITES}]")
        elif key == "staleness":
            check(
                type(value) is int and 0 <= value <= MAX_STALENESS,
                key,
                value,
                f"an integer in [0, {MAX_STALENESS}]",
            )
        else:
            check(
                type(value) is int and 1 <= value <= MAX_BATCH_SIZE,
                key,
                value,
                f"an integer in [1, {MAX_BATCH_SIZE}]",
            )
    return dict(values)
