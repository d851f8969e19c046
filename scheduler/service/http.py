"""The scheduler's local HTTP endpoint: ``GET /status``, ``GET /metrics``, ``POST /config``.

``POST /config`` changes the job (``{"values": {...}}``: held until ``{"release": true | [keys]}``), so it
needs the control token (``Authorization: Bearer <token>``, the
content of ``control_token_file``; off when unset), JSON only, bounded in size and depth
(:mod:`wanrt.protocol.http_control`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from aiohttp import web

from transports.http_endpoint import HttpEndpoint
from wanrt.errors import ConfigError
from wanrt.protocol.http_control import ControlRefused, check_control_request, parse_json_body

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
            if isinstance(body, dict) and len(body) == 1 and "release" in body:
                out = self._owner.release(_release_keys(body["release"]))
            elif isinstance(body, dict) and isinstance(body.get("values"), dict) and len(body) == 1:
                out = self._owner.request(body["values"])
            else:
                raise ConfigError(
                    'body must be {"values": {...}} (held until released) or {"release": true | [keys]}',
                    key="values",
                )
        except ControlRefused as exc:
            return _error(exc.status, exc.message)
        except ConfigError as exc:
            return _error(400, str(exc))
        log.info("configuration change requested over HTTP: %s", out)
        return web.json_response(out)


def _release_keys(value: Any) -> list[str] | None:
    """``true``: every held value; a list of key names: those."""
    if value is True:
        return None
    if isinstance(value, list) and value and all(isinstance(k, str) for k in value):
        return list(value)
    raise ConfigError("release must be true or a list of held keys", key="release")


def _error(status: int, reason: str) -> web.Response:
    return web.json_response({"error": reason}, status=status)
