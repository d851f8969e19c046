"""``connect(url)`` / ``listen(url, handler)``: pick the byte mover from the URL scheme.

The one entry point gateways and trainer clients use, so a deployment switches between TCP, unix sockets,
in-memory links and shaped (emulated WAN) links by configuration only (see :mod:`transports.urls`).
"""

from __future__ import annotations

from transports.base import Handler, Listener, Transport, Wrap
from transports.link import LinkShape
from transports.memory import listen_memory, open_memory
from transports.shaped import ShapedTransport
from transports.stream import listen_tcp, listen_unix, open_tcp, open_unix
from transports.timeouts import DEFAULT_TIMEOUTS, Timeouts
from transports.tls import TLSConfig
from transports.urls import parse_url
from wanrt.errors import ConfigError

__all__ = ["connect", "listen"]


def _shaper(shape: LinkShape | None, timeouts: Timeouts) -> Wrap | None:
    if shape is None:
        return None
    return lambda t: ShapedTransport(t, shape, timeouts=timeouts)


async def connect(
    url: str,
    *,
    tls: TLSConfig | None = None,
    timeouts: Timeouts = DEFAULT_TIMEOUTS,
    sock_buffer: int | None = None,
) -> Transport:
    """Connect to ``url``. Failure → TransportError naming the URL; deadline → WanrtTimeout(phase=...)."""
    ep = parse_url(url)
    transport: Transport
    if ep.scheme == "tcp":
        transport = await open_tcp(ep.host, ep.port, tls=tls, timeouts=timeouts, sock_buffer=sock_buffer)
    elif ep.scheme == "unix":
        transport = await open_unix(ep.path, tls=tls, timeouts=timeouts)
    else:
        if tls is not None:
            raise ConfigError("TLS is meaningless on mem:// links", key="tls", value=url)
        transport = await open_memory(ep.path, timeouts=timeouts)
    wrap = _shaper(ep.shape, timeouts)
    return wrap(transport) if wrap is not None else transport


async def listen(
    url: str,
    handler: Handler,
    *,
    tls: TLSConfig | None = None,
    timeouts: Timeouts = DEFAULT_TIMEOUTS,
    sock_buffer: int | None = None,
) -> Listener:
    """Accept connections on ``url``, running ``handler(transport)`` for each in its own task.

    A URL query shapes what this side sends on every accepted connection. ``tcp://host:0`` binds a free
    port: read the real one from ``listener.url`` / ``listener.address``.
    """
    ep = parse_url(url)
    wrap = _shaper(ep.shape, timeouts)
    if ep.scheme == "tcp":
        return await listen_tcp(
            ep.host, ep.port, handler, tls=tls, timeouts=timeouts, sock_buffer=sock_buffer, wrap=wrap
        )
    if ep.scheme == "unix":
        return await listen_unix(ep.path, handler, tls=tls, timeouts=timeouts, wrap=wrap)
    if tls is not None:
        raise ConfigError("TLS is meaningless on mem:// links", key="tls", value=url)
    return await listen_memory(ep.path, handler, timeouts=timeouts, wrap=wrap)
