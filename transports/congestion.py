"""Which TCP congestion control a WAN link's socket runs (``TCP_CONGESTION``, Linux).

Why the gateway chooses it instead of taking the host's default. Every gateway-to-gateway link is paced by
the gateway itself (:class:`~gateways.sending.pacer.Pacer`, at the link's target rate), so the congestion
control only has to keep the bottleneck full behind that pacing. Measured on 3 sites joined by tbf-shaped
100 Mbit/s links (``tools/bench_round.py``, docs/round_bench.md "Session 14"), a host whose default is BBR
kept the links busy for 2–7 % less of a round than cubic did: BBR's model reads the pacing and the
receiver's ACK timing on a loaded host as a lower bottleneck rate, cubic simply keeps the queue filled.
Cubic is also what an unconfigured Linux host runs; ``""`` keeps whatever the host's default is (pick
``bbr`` where paths lose packets at random: cubic backs off on every loss).
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
