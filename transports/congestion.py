"""Which TCP congestion control a WAN link's socket runs (``TCP_CONGESTION``, Linux).

Why the gateway chooses it instead of taking the host's default. Every gateway-to-gateway link is paced
by the gateway itself (:class:`~gateways.sending.pacer.Pacer`: the link's target rate, a 60 ms bucket
that covers event-loop stalls), so the congestion control only has to keep the bottleneck full behind
that pacing, which a loss-based one (cubic, the kernel's own default) does by keeping its queue filled.
BBR paces by its own model of the path instead; measured on 3 sites joined by tbf-shaped 100 Mbit/s links
(``tools/bench_round.py``, docs/round_bench.md "Session 14"), a BBR host took 1.31-1.33x the link limit
per dense round where cubic took 1.09. ``""`` keeps whatever the host's default is; pick ``bbr`` where
paths lose packets at random (cubic backs off on every loss).
"""

from __future__ import annotations

import re
import socket
from typing import Final

__all__ = ["CONGESTION_NAME", "set_congestion"]

#: A kernel congestion-control name (``TCP_CA_NAME_MAX`` is 16 bytes with its NUL).
CONGESTION_NAME: Final = re.compile(r"[a-z0-9_]{1,15}")


def set_congestion(transport: object, name: str) -> str | None:
    """Run ``name`` on ``transport``'s TCP socket. None when set (or nothing to set: ``name`` is empty, the
    transport is not TCP, or the platform has no ``TCP_CONGESTION``); else why not, for the log. The link
    works either way: a refused name leaves the host's default in place."""
    if not name:
        return None
    option = getattr(socket, "TCP_CONGESTION", None)
    info = getattr(transport, "get_extra_info", None)
    if option is None or info is None:
        return None
    sock = info("socket")
    if not hasattr(sock, "setsockopt") or getattr(sock, "family", None) not in (
        socket.AF_INET,
        socket.AF_INET6,
    ):
        return None
    try:
        sock.setsockopt(socket.IPPROTO_TCP, option, name.encode())
    except OSError as exc:
        # ENOENT: the kernel has no such module; EPERM: not in net.ipv4.tcp_allowed_congestion_control
        return f"TCP congestion control {name!r} not set ({exc.strerror or exc}); the host's default runs"
    return None
