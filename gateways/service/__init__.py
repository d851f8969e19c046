"""The gateway's I/O: the asyncio daemon, its peer and trainer connections, HTTP, the CLI. The only part of
``gateways`` that may import asyncio, sockets or clocks; it decides nothing (see gateways.node)."""
