"""Running more sites than the wire protocol allows: the one place the simulator departs from the daemons.

The protocol bounds a job at :data:`wanrt.protocol.limits.MAX_SITES` (256) sites: ``Aggregate.sites`` and
a round tag's contribution ids are checked against it on the wire, and ``GatewayConfig`` accepts at most
``MAX_SITES - 1`` peers. A 1 000-site tree therefore cannot run on today's protocol: the root's final
result names 1 000 sites. Scenarios that set ``[sim] protocol_site_limit`` run with those three checks
raised to that value, for the duration of the run only (restored afterwards, even on error). Everything
else — framing, msgpack limits, every other check — is unchanged; msgpack's array bound
(``MAX_HEADER_ARRAY_LEN`` = 1024) caps how far the limit can go. Raising ``MAX_SITES`` itself is a
protocol decision for ``wanrt/protocol/limits.py``, not the simulator's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Final

import gateways.config as gateway_config
import gateways.wire.round_frames as round_frames
import wanrt.protocol.messages as protocol_messages
from wanrt.config import check
from wanrt.protocol.limits import MAX_HEADER_ARRAY_LEN, MAX_SITES

__all__ = ["HIGHEST_SITE_LIMIT", "protocol_site_limit"]

#: msgpack refuses arrays and maps longer than this in a header: an Aggregate listing more sites, or a
#: tag with more contribution sites, could not be decoded whatever MAX_SITES says.
HIGHEST_SITE_LIMIT: Final = MAX_HEADER_ARRAY_LEN


@contextlib.contextmanager
def protocol_site_limit(limit: int) -> Iterator[None]:
    """Within the block, the protocol's site checks allow ``limit`` sites (0 or <= MAX_SITES: no change)."""
    if limit <= MAX_SITES:
        yield
        return
    check(limit <= HIGHEST_SITE_LIMIT, "protocol_site_limit", limit, f"at most {HIGHEST_SITE_LIMIT}")
    saved = (protocol_messages.MAX_SITES, round_frames.MAX_SITES, gateway_config.MAX_PEERS)
    protocol_messages.MAX_SITES = limit  # type: ignore[misc]
    round_frames.MAX_SITES = limit  # type: ignore[misc]
    gateway_config.MAX_PEERS = limit - 1  # type: ignore[misc]
    try:
        yield
    finally:
        protocol_messages.MAX_SITES, round_frames.MAX_SITES, gateway_config.MAX_PEERS = saved  # type: ignore[misc]
