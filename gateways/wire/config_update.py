"""Configuration updates for the site's trainers (``POST /config`` now, the scheduler later), checked here
so that a typo is answered with the key it names instead of reaching every rank of the site.

The keys are those the trainer client acts on (``wanrt.client.link.gateway_link.CONFIG_KEYS``):
``density`` (fraction of gradient elements sent), ``staleness`` (iterations a layer's update may lag) and
``batch_size``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from wanrt.live_settings import TRAINER_KEYS, check_live_settings
from wanrt.protocol import ConfigUpdate

__all__ = ["TRAINER_CONFIG_KEYS", "trainer_config_update"]

TRAINER_CONFIG_KEYS: Final = TRAINER_KEYS


def trainer_config_update(values: Mapping[str, Any], effective_iteration: int) -> ConfigUpdate:
    """The ConfigUpdate for ``values`` from ``effective_iteration`` on; ConfigError names a bad key (the
    bounds are :mod:`wanrt.live_settings`, shared with the client and the scheduler)."""
    return ConfigUpdate(check_live_settings(values), effective_iteration)
