"""Run :mod:`sims.netns.peer` inside a namespace from asyncio and read its JSON-line reports.

Waiting is on readiness only: :meth:`PeerProcess.expect` returns when the process prints the event asked
for (``ready`` once it listens, ``done`` once it finished) and fails at once, with the process's stderr, if
it exits first. No sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Self

from sims.netns.peer import SECRET_ENV
from sims.netns.topology import Emulation
from wanrt.codec.kernel_choice import KERNEL_ENV

__all__ = ["PeerProcess"]


class PeerProcess:
    """One peer process: ``async with await PeerProcess.start(emu, 1, ["serve", ...], secret=s) as p``.

    Leaving the block kills the process if it still runs (by its own pid) and reaps it.
    """

    def __init__(self, proc: asyncio.subprocess.Process, label: str) -> None:
        self.proc, self.label = proc, label
        self.events: list[dict[str, Any]] = []
        self._stderr = bytearray()
        assert proc.stderr is not None
        self._stderr_task = asyncio.ensure_future(self._drain(proc.stderr))

    @classmethod
    async def start(
        cls, emu: Emulation, site: int, args: Sequence[str], *, secret: bytes, kernels: str = "numpy"
    ) -> Self:
        """Start ``python -m sims.netns.peer *args`` in ``site``'s namespace.

        ``kernels`` sets WANRT_KERNELS for the codec: the NumPy reference by default, because what these
        peers test is the network path, and the fused path's numba import and JIT cost each process
        seconds of start-up on a small machine (the codec paths are tested against each other elsewhere).
        """
        env = dict(os.environ, **{SECRET_ENV: secret.hex(), KERNEL_ENV: kernels}, PYTHONUNBUFFERED="1")
        argv = emu.exec_argv(site, [sys.executable, "-m", "sims.netns.peer", *args])
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        return cls(proc, f"site {site}: {' '.join(args[:1])}")

    async def _drain(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(65536):
            self._stderr += chunk

    async def stderr(self) -> str:
        """All stderr, once the process has exited (the drain task ends at EOF)."""
        await self._stderr_task
        return self._stderr.decode(errors="replace")

    async def expect(self, event: str, timeout: float = 30.0) -> dict[str, Any]:
        """The next report whose ``event`` is ``event`` (earlier ones are kept in ``events``)."""
        assert self.proc.stdout is not None
        async with asyncio.timeout(timeout):
            while line := await self.proc.stdout.readline():
                report = json.loads(line)
                self.events.append(report)
                if report["event"] == event:
                    return report
            rc = await self.proc.wait()
            raise AssertionError(f"{self.label} exited ({rc}) before {event!r}: {await self.stderr()}")
        raise TimeoutError  # not reached: asyncio.timeout raises on expiry; mypy cannot see that

    async def tell(self, line: str) -> None:
        """Write one line to the process's stdin (``send --url -`` reads the server URL this way)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        await self.proc.stdin.drain()

    async def wait(self, timeout: float = 30.0) -> int:
        """Read the remaining reports into ``events`` until the process exits; its exit status."""
        assert self.proc.stdout is not None
        async with asyncio.timeout(timeout):
            while line := await self.proc.stdout.readline():
                self.events.append(json.loads(line))
            return await self.proc.wait()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()
        await self._stderr_task
