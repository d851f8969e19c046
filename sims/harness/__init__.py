"""Harnesses on real transports, shared by the tests and the benchmarks (tools/ must not import tests/).

A fake gateway and a fake trainer that speak the real protocol, several real gateway daemons in one process,
and the kill-and-restart scenario under torchrun. These are I/O adapters (asyncio, sockets, subprocesses),
so the sans-IO guard lists this package among its exclusions.
"""
