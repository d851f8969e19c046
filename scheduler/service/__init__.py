"""The scheduler's I/O: the asyncio daemon, its HTTP endpoint and the CLI (the only part of ``scheduler``
that may import asyncio, sockets or clocks)."""
