"""The gateway's local HTTP endpoint (aiohttp on ``metrics_host:metrics_port``, off when the port is 0).

* ``GET /metrics`` — Prometheus text: bytes per peer, queue depth, rounds, late contributions, peer up/down,
  link rates, stragglers (:func:`gateways.stats.render_prometheus`).
* ``GET /status`` — JSON: peers with state and rates, queue depth, recent rounds, the frontier iteration.
* ``POST /config`` — JSON ``{"values": {"density": 0.01, ...}, "effective_iteration": N}`` (N optional):
  a configuration update forwarded to this site's trainer as a ``ConfigUpdate``, for a job without a
  scheduler (with one, changes go to the scheduler: 409 here). Needs the control token
  (``Authorization: Bearer <token>``; 403 when ``control_token_file`` is unset, 401 when wrong), a JSON body
  (415 otherwise), bounded in size and depth (:mod:`wanrt.protocol.http_control`); 400 with the reason for a
  bad value.

The views are read-only; keep the port on loopback unless a scraper needs it.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any, Protocol

from aiohttp import web

from transports.http_endpoint import HttpEndpoint
from wanrt.errors import ConfigError, LocalProtocolError
from wanrt.protocol.http_control import ControlRefused, check_control_request, parse_json_body

__all__ = ["HttpOwner", "MetricsServer"]

log = logging.getLogger(__name__)


class HttpOwner(Protocol):
    def status(self) -> dict[str, Any]: ...

    def metrics_text(self) -> str: ...

    def apply_config(self, values: dict[str, Any], effective_iteration: int | None) -> dict[str, Any]: ...

    def control_token(self) -> str | None: ...

    def scheduler_url(self) -> str | None: ...


class MetricsServer(HttpEndpoint):
    """The gateway's endpoint (see the module docstring)."""

    def __init__(self, owner: HttpOwner, host: str, port: int) -> None:
        super().__init__(host, port)
        self._owner = owner

    def routes(self) -> list[tuple[str, str, Any]]:
        return [
            ("GET", "/metrics", self._metrics),
            ("GET", "/status", self._status),
            ("POST", "/config", self._config),
        ]

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self._owner.metrics_text(), content_type="text/plain", charset="utf-8")

    async def _status(self, request: web.Request) -> web.Response:
        return web.json_response(self._owner.status(), dumps=_dumps)

    async def _config(self, request: web.Request) -> web.Response:
        try:
            check_control_request(
                self._owner.control_token(), request.headers.get("Authorization", ""), request.content_type
            )
        except ControlRefused as exc:
            return web.json_response({"error": exc.message}, status=exc.status)
        scheduler = self._owner.scheduler_url()
        if scheduler is not None:
            return web.json_response(
                {"error": f"this job has a scheduler ({scheduler}): send configuration changes there"},
                status=409,
            )
        try:
            body = parse_json_body(await request.read())
        except ConfigError as exc:
            return _bad(str(exc))
        if not isinstance(body, dict) or not isinstance(body.get("values"), dict):
            return _bad('body must be {"values": {...}, "effective_iteration": N}')
        extra = sorted(set(body) - {"values", "effective_iteration"})
        if extra:
            return _bad(f"unknown field {extra[0]!r}")
        effective = body.get("effective_iteration")
        if effective is not None and (type(effective) is not int or effective < 0):
            return _bad("effective_iteration must be a non-negative integer")
        try:
            applied = self._owner.apply_config(body["values"], effective)
        except (ConfigError, LocalProtocolError) as exc:
            return _bad(str(exc))
        log.info("configuration update via HTTP: %s", applied)
        return web.json_response(applied)


def _bad(reason: str) -> web.Response:
    return web.json_response({"error": reason}, status=400)


def _dumps(obj: Any) -> str:
    return json.dumps(_json_safe(obj))


def _json_safe(obj: Any) -> Any:
    """inf/nan (a link time that never finished) are not JSON: they become strings."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj
