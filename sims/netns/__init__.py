"""Emulated WAN on real network namespaces: sites joined by veth pairs, shaped by tc (docs/emulation.md).

Needs root, ``ip`` and ``tc`` (iproute2). Importing this package runs nothing; :func:`probe` finds out what
the machine can do, :class:`Emulation` builds and tears down, :mod:`sims.netns.peer` is the wanrt endpoint
run inside a namespace, and ``tools/netem.py`` drives it all by hand.
"""

from sims.netns.caps import Capabilities, probe, probe_uncached
from sims.netns.names import cleanup_stale, list_namespaces
from sims.netns.run import NetemUnavailable, NetnsError
from sims.netns.shape import NETEM_MISSING, Shape, transport_query
from sims.netns.topology import HUB, Emulation, Port

__all__ = [
    "HUB",
    "NETEM_MISSING",
    "Capabilities",
    "Emulation",
    "NetemUnavailable",
    "NetnsError",
    "Port",
    "Shape",
    "cleanup_stale",
    "list_namespaces",
    "probe",
    "probe_uncached",
    "transport_query",
]
