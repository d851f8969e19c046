"""Byte movers: TCP, unix sockets, in-memory pairs and shaped (emulated WAN) links behind one interface.

Internal package of wanrt (see docs/transports.md); the contract other parts code against is
docs/dev/contracts.md "Transports". Importing it has no side effects (no event loop, no uvloop).
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

# Loaded on first use (PEP 562): the sans-IO parts of the gateway and the simulator import single modules
# (token_bucket, link, timeouts) without pulling in asyncio through the socket transports.
_WHERE = {
    "Handler": "transports.base",
    "Listener": "transports.base",
    "Transport": "transports.base",
    "connect": "transports.dial",
    "listen": "transports.dial",
    "LinkShape": "transports.link",
    "install_uvloop": "transports.loop",
    "MemoryTransport": "transports.memory",
    "memory_pair": "transports.memory",
    "ShapedTransport": "transports.shaped",
    "StreamTransport": "transports.stream",
    "Timeouts": "transports.timeouts",
    "TLSConfig": "transports.tls",
    "TokenBucket": "transports.token_bucket",
    "BandwidthTrace": "transports.traces",
    "TracePlayer": "transports.traces",
    "drive_trace": "transports.traces",
    "profile_traces": "transports.traces",
    "Endpoint": "transports.urls",
    "parse_url": "transports.urls",
}

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


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'transports' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value
