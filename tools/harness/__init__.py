"""Test fixtures on real transports, shared by the tests and the benchmarks (tools/ must not import tests/).

A fake gateway and a fake trainer that speak the real protocol (with the exact payloads and parameters they
send), several real gateway daemons in one process, and the kill-and-restart scenario under torchrun. They
live in tools/, which the wheel does not ship (pyproject's ``packages.find``), so an installed wanrt holds
none of them; tests and benchmarks import them from the repository root.
"""
