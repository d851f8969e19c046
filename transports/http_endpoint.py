"""The local HTTP endpoint both daemons serve (``/status``, ``/metrics``, ``POST /config``): an aiohttp
server started and stopped with the daemon.

It moves bytes for the gateway and the scheduler alike, so it sits on the transports floor, below both;
what a control call must carry before its body is read is :mod:`wanrt.protocol.http_control`.
"""

from __future__ import annotations

from typing import Any

from wanrt.protocol.http_control import MAX_BODY

__all__ = ["HttpEndpoint"]


class HttpEndpoint:
    """A daemon's local HTTP endpoint: ``/status`` and ``/metrics`` from its owner, ``POST /config`` to a
    handler; :attr:`url` is the bound address once started. aiohttp is imported here, at start, so a
    daemon with the port off never loads it."""

    def __init__(self, host: str, port: int) -> None:
        self._host, self._port = host, port
        self._runner: Any = None
        self.url: str | None = None

    def routes(self) -> list[tuple[str, str, Any]]:
        """(method, path, handler) triples; subclasses say which."""
        raise NotImplementedError

    async def start(self) -> None:
        from aiohttp import web

        app = web.Application(client_max_size=MAX_BODY)
        for method, path, handler in self.routes():
            app.router.add_route(method, path, handler)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._port)
        try:
            await site.start()
        except OSError:
            await runner.cleanup()
            raise
        self._runner = runner
        host, port = runner.addresses[0][:2]
        self.url = f"http://[{host}]:{port}" if ":" in str(host) else f"http://{host}:{port}"

    async def aclose(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
