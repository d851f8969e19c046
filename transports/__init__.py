"""Byte movers: TCP, unix sockets, in-memory pairs and shaped (emulated WAN) links behind one interface.

Internal package of wanrt (see docs/transports.md); the contract other parts code against is
docs/dev/contracts.md "Transports". Importing it has no side effects (no event loop, no uvloop).
"""

from transports.base import Handler, Listener, Transport
from transports.dial import connect, listen
from transports.link import LinkShape
from transports.loop import install_uvloop
from transports.memory import MemoryTransport, memory_pair
from transports.shaped import ShapedTransport
from transports.stream import StreamTransport
from transports.timeouts import Timeouts
from transports.tls import TLSConfig
from transports.token_bucket import TokenBucket
from transports.traces import BandwidthTrace, TracePlayer, drive_trace, profile_traces
from transports.urls import Endpoint, parse_url

__all__ = [
    "BandwidthTrace",
    "Endpoint",
    "Handler",
    "LinkShape",
    "Listener",
    "MemoryTransport",
    "ShapedTransport",
    "StreamTransport",
    "TLSConfig",
    "Timeouts",
    "TokenBucket",
    "TracePlayer",
    "Transport",
    "connect",
    "drive_trace",
    "install_uvloop",
    "listen",
    "memory_pair",
    "parse_url",
    "profile_traces",
]
