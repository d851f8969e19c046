"""Checks every state-changing HTTP call of a wanrt daemon makes before it reads a value (gateway and
scheduler alike): a control token, JSON only, bounded size and nesting.

The rules of the HTTP control plane are a wire schema like the protocol's, so they live on the ground
floor (sans-IO: headers and bytes in, a value or :class:`ControlRefused` out); the server that applies
them is :class:`transports.http_endpoint.HttpEndpoint`.

Why each: without a token any local user (uid nobody included) could change a running job; a browser can
POST ``text/plain`` cross-origin without a preflight, so only ``application/json`` is accepted; and
``json.loads`` recurses, so a deeply nested body must be refused before it is parsed (a RecursionError
would otherwise surface as a 500 with a traceback).
"""

from __future__ import annotations

import hmac
import json
from typing import Any, Final

from wanrt.errors import ConfigError

__all__ = [
    "MAX_BODY",
    "MAX_DEPTH",
    "ControlRefused",
    "check_control_request",
    "parse_json_body",
]

#: A configuration change is a handful of keys; anything larger is not one.
MAX_BODY: Final = 16 * 1024
#: {"values": {...}} is two levels deep; deeper nesting is refused before it reaches json.
MAX_DEPTH: Final = 4


class ControlRefused(ConfigError):
    """A control call refused before its body was read; ``status`` is the HTTP status to answer."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message, key="http")
        self.status = status


def check_control_request(token: str | None, authorization: str, content_type: str) -> None:
    """Raise :class:`ControlRefused` unless the call carries ``Bearer <token>`` and a JSON body."""
    if token is None:
        raise ControlRefused("configuration changes over HTTP are off: set control_token_file", status=403)
    if not hmac.compare_digest(authorization.encode(), f"Bearer {token}".encode()):
        raise ControlRefused("missing or wrong control token (Authorization: Bearer <token>)", status=401)
    if content_type != "application/json":
        raise ControlRefused("Content-Type must be application/json", status=415)


def parse_json_body(raw: bytes) -> Any:
    """The JSON value in ``raw``; ConfigError (status 400) for a body too large, too deep or not JSON."""
    if len(raw) > MAX_BODY:
        raise ConfigError(f"body larger than {MAX_BODY} bytes", key="body")
    depth = 0
    in_string = escaped = False
    for byte in raw:  # bound the nesting before json recurses (structural bytes are ASCII in UTF-8)
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > MAX_DEPTH:
                raise ConfigError(f"body nested deeper than {MAX_DEPTH}", key="body")
        elif byte in (0x5D, 0x7D):
            depth -= 1
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"body is not JSON: {exc}", key="body") from None
