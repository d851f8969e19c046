"""The scheduler's local HTTP endpoint: ``GET /status``, ``GET /metrics``, ``POST /config``.

``POST /config`` changes the job, so it needs the control token: ``Authorization: Bearer <token>`` where
the token is the content of ``control_token_file`` (off when that key is unset). Bodies are JSON objects
(``Content-Type: application/json`` only, so a browser's cross-origin ``text/plain`` form cannot reach
it), at most :data:`MAX_BODY` bytes and nested at most :data:`MAX_DEPTH` deep.
"""

from __future__ import annotations

import hmac
import json
import logging
from typing import TYPE_CHECKING, Any, Final

from aiohttp import web

from wanrt.errors import ConfigError

if TYPE_CHECKING:
    from scheduler.service.daemon import SchedulerDaemon

__all__ = ["MAX_BODY", "MAX_DEPTH", "SchedulerHttp", "parse_body"]

log = logging.getLogger(__name__)

#: A configuration change is a handful of keys; anything larger is not one.
MAX_BODY: Final = 16 * 1024
#: {"values": {...}} is two levels; deeper nesting is refused before it reaches any code.
MAX_DEPTH: Final = 4


def parse_body(raw: bytes) -> dict[str, Any]:
    """The JSON object in ``raw``, or ConfigError saying what is wrong (size, depth, shape)."""
    if len(raw) > MAX_BODY:
        raise ConfigError(f"body larger than {MAX_BODY} bytes", key="body")
    depth = 0
    in_string = escaped = False
    for ch in raw.decode("utf-8", errors="replace"):  # bound the depth before json recurses
        if in_string:
            escaped = not escaped and ch == "\\"
            if ch == '"' and not escaped:
                in_string = False
            continue
        if ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise ConfigError(f"body nested deeper than {MAX_DEPTH}", key="body")
        elif ch in "]}":
            depth -= 1
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"body is not JSON: {exc}", key="body") from None
    if not isinstance(body, dict) or not isinstance(body.get("values"), dict):
        raise ConfigError('body must be {"values": {...}}', key="values")
    extra = sorted(set(body) - {"values"})
    if extra:
        raise ConfigError(f"unknown field {extra[0]!r}", key=extra[0])
    return body


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
        token = self._owner.control_token()
        if token is None:
            return _error(403, "configuration changes over HTTP are off: set control_token_file")
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return _error(401, "missing or wrong control token (Authorization: Bearer <token>)")
        if request.content_type != "application/json":
            return _error(415, "Content-Type must be application/json")
        try:
            body = parse_body(await request.read())
            out = self._owner.request(body["values"])
        except ConfigError as exc:
            return _error(400, str(exc))
        log.info("configuration change requested over HTTP: %s", out)
        return web.json_response(out)


def _error(status: int, reason: str) -> web.Response:
    return web.json_response({"error": reason}, status=status)
