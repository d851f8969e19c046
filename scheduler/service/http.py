"""The scheduler's local HTTP endpoint: ``GET /status``, ``GET /metrics``, ``POST /config``.

``POST /config`` changes the job, so it needs the control token (``Authorization: Bearer <token>``, the
content of ``control_token_file``; off when unset), JSON only, bounded in size and depth
(:mod:`transports.http_control`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from aiohttp import web

from transports.http_control import MAX_BODY, ControlRefused, check_control_request, parse_json_body
from wanrt.errors import ConfigError

if TYPE_CHECKING:
    from scheduler.service.daemon import SchedulerDaemon

__all__ = ["SchedulerHttp"]

log = logging.getLogger(__name__)


class SchedulerHttp:
    def __init__(self, owner: SchedulerDaemon, host: str, port: int) -> None:
        self._owner = owner
        self._host, self._port = host, port
        self._runner: web.AppRunner | None = None
        self.url: str | None = None

    async def start(self) -> None:
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_get("/status", self._status)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/config", self._config)
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

    async def _status(self, request: web.Request) -> web.Response:
        return web.json_response(self._owner.status())

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self._owner.metrics_text(), content_type="text/plain", charset="utf-8")

    async def _config(self, request: web.Request) -> web.Response:
        try:
            check_control_request(
                self._owner.control_token(), request.headers.get("Authorization", ""), request.content_type
            )
            body = parse_json_body(await request.read())
            if not isinstance(body, dict) or not isinstance(body.get("values"), dict) or len(body) != 1:
                raise ConfigError('body must be {"values": {...}}', key="values")
            out = self._owner.request(body["values"])
        except ControlRefused as exc:
            return _error(exc.status, exc.message)
        except ConfigError as exc:
            return _error(400, str(exc))
        log.info("configuration change requested over HTTP: %s", out)
        return web.json_response(out)


def _error(status: int, reason: str) -> web.Response:
    return web.json_response({"error": reason}, status=status)
