"""Bytes the kernel sent through a shaped direction, and reshaping every direction at once.

``tc -s qdisc show`` counts every byte a qdisc dequeued (IP and TCP headers included): the one byte count
that does not depend on the endpoints' honesty, so a run whose processes have their own counters (wanrt's
gateways) and a run without (gloo under DDP) are measured the same way.
"""

from __future__ import annotations

import re
from typing import Final

from sims.netns.run import NetnsError, run
from sims.netns.shape import Shape
from sims.netns.topology import Emulation

__all__ = ["parse_sent_bytes", "reshape_all", "sent_bytes"]

#: the root qdisc's line of ``tc -s qdisc show`` statistics: " Sent 123 bytes 4 pkt (dropped 0, ...)"
_SENT: Final = re.compile(r"^\s*Sent (\d+) bytes", re.MULTILINE)


def parse_sent_bytes(stats: str) -> int:
    """The first (root) qdisc's byte count in ``tc -s qdisc show dev X`` output."""
    m = _SENT.search(stats)
    if m is None:
        raise NetnsError("no 'Sent N bytes' line in tc statistics", stderr=stats[:200])
    return int(m.group(1))


def sent_bytes(emu: Emulation, src: int, dst: int) -> int:
    """Bytes sent so far on the veth end that carries ``src`` → ``dst`` (its root qdisc's counter)."""
    port = emu.port(src, dst)
    return parse_sent_bytes(run(["tc", "-s", "-n", port.ns, "qdisc", "show", "dev", port.dev])[1])


def reshape_all(emu: Emulation, shape: Shape) -> None:
    """Give every direction ``shape`` now (benchmarks step one emulation through several rates)."""
    for direction in emu.directions:
        emu.set_shape(*direction, shape)
