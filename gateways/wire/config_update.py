"""Configuration updates for the site's trainers (``POST /config`` now, the scheduler later), checked here
so that a typo is answered with the key it names instead of reaching every rank of the site.

The keys are those the trainer client acts on (``wanrt.client.link.gateway_link.CONFIG_KEYS``):
``density`` (fraction of gradient elements sent), ``staleness`` (iterations a layer's update may lag) and
``batch_size``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from wanrt.config import check
from wanrt.errors import ConfigError
from wanrt.protocol import ConfigUpdate

__all__ = ["TRAINER_CONFIG_KEYS", "trainer_config_update"]

TRAINER_CONFIG_KEYS: Final = ("density", "staleness", "batch_size")


def trainer_config_update(values: Mapping[str, Any], effective_iteration: int) -> ConfigUpdate:
    """The ConfigUpdate for ``values`` from ``effective_iteration`` on; ConfigError names a bad key."""
    if not values:
        raise ConfigError("no settings given", key="values")
    for key, value in values.items():
        check(
            key in TRAINER_CONFIG_KEYS, key, value, f"trainer settings are {', '.join(TRAINER_CONFIG_KEYS)}"
        )
        if key == "density":
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            check(number and 0 < value <= 1, key, value, "a number in (0, 1]")
        else:
            low = 0 if key == "staleness" else 1
            check(type(value) is int and value >= low, key, value, f"an integer >= {low}")
    return ConfigUpdate(dict(values), effective_iteration)
