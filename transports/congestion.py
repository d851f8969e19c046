"""Which TCP congestion control a WAN link's socket runs (``TCP_CONGESTION``, Linux; ``[gateway]
tcp_congestion``).

Why it is a per-gateway choice and not left to the host. The gateway paces every peer link itself
(:class:`~gateways.sending.pacer.Pacer`), so the congestion control's job is to keep the bottleneck full
behind that pacing, and which one does that best depends on the path, not on what the host's other
traffic wants: on delay-free emulated links (tbf-shaped veths, ``tools/bench_round.py``) BBR's model
sees a ~10 µs minimum RTT and under-paces dense rounds (1.31x the link limit against cubic's 1.09,
docs/round_bench.md "Session 14"), while cubic keeps a small window on bursty sparse rounds, which on a
long path costs round trips. ``""`` keeps the host's default.
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
