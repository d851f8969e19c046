"""The scheduler's local HTTP endpoint: ``GET /status``, ``GET /metrics``, ``POST /config``.

``POST /config`` changes the job, so it needs the control token (``Authorization: Bearer <token>``, the
content of ``control_token_file``; off when unset), JSON only, bounded in size and depth
(:mod:`transports.http_control`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from aiohttp import web

from transports.http_control import ControlRefused, HttpEndpoint, check_control_request, parse_json_body
from wanrt.errors import ConfigError

if TYPE_CHECKING:
    from scheduler.service.daemon import SchedulerDaemon

__all__ = ["SchedulerHttp"]

log = logging.getLogger(__name__)


class SchedulerHttp(HttpEndpoint):
    """The scheduler's endpoint (see the module docstring)."""

    def __init__(self, owner: SchedulerDaemon, host: str, port: int) -> None:
        super().__init__(host, port)
        self._owner = owner

    def routes(self) -> list[tuple[str, str, Any]]:
        return [
            ("GET", "/status", self._status),
            ("GET", "/metrics", self._metrics),
            ("POST", "/config", self._config),
        ]

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
