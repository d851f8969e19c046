"""``wanrt.init``'s look at the site's gateway: reachable, the same job secret, and willing to serve this
run — before the user builds a model or loads data.

Why at ``init`` and not at the first ``opt.step()``: a run started against gateways that serve another run
(the last one finished there, or is still training) used to be refused only after the optimizer's
handshake, at the first step, with the refusal repeated by every layer's push. The probe sends a Hello
with the run's id (and ``resume_at`` for a checkpoint resume) and no model, checks the Welcome's proof
(AuthError if the gateway does not hold this site's key) and reads its ``refused``: the gateway's verdict
on this run (gateways.node.trainer_runs). It never authenticates, so the gateway counts nothing. A
refusal with ``retry`` (the gateway still sees an earlier trainer of this site connected: a torchrun
restart can come before the old connection's end) is asked again until ``retry_s`` passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from transports import Timeouts, connect
from transports.connection_io import next_event
from wanrt.client.errors import GatewayUnreachable, RunRefused
from wanrt.errors import AuthError, RemoteProtocolError, TransportError, WanrtTimeout
from wanrt.protocol.connection import Connection
from wanrt.protocol.messages import ErrorCode, Reject, Welcome

__all__ = ["probe_failure", "probe_gateway"]

#: between two probes while the gateway still sees an earlier trainer of this site connected
RETRY_EVERY_S = 0.5


async def _probe_once(
    url: str, site: str, job: str, secret: bytes, info: dict[str, Any], timeout_s: float
) -> dict[str, Any]:
    timeouts = Timeouts(connect=timeout_s, handshake=timeout_s)
    try:
        transport = await connect(url, timeouts=timeouts)
    except (TransportError, WanrtTimeout, OSError) as exc:
        raise GatewayUnreachable(url, str(exc)) from None
    conn = Connection("trainer", site, job, secret, side="client", peer=url)
    try:
        async with asyncio.timeout(timeout_s):
            await transport.send([conn.hello(info=info)])
            try:
                event = await next_event(conn, transport)
            except AuthError as exc:
                raise AuthError(
                    f"gateway {url} does not share this job's secret ({exc.message})",
                    peer=url,
                    hint="secret_file must hold the same key as the gateway's job secret",
                ) from None
    except TimeoutError:
        raise WanrtTimeout(
            f"handshake with gateway {url} took longer than {timeout_s} s",
            phase="handshake",
            seconds=timeout_s,
        ) from None
    finally:
        with contextlib.suppress(Exception):
            await transport.close()
    if isinstance(event, Welcome):
        return dict(event.info)
    if isinstance(event, Reject):
        if event.code == ErrorCode.AUTH:
            raise AuthError(f"gateway {url} refused this trainer: {event.reason}", peer=url)
        raise RemoteProtocolError(f"gateway {url} refused this trainer: {event.reason}", peer=url)
    raise TransportError(f"gateway {url} closed the connection during the handshake", peer=url)


def probe_gateway(
    url: str,
    *,
    site: str,
    job: str,
    secret: bytes,
    run: str,
    resume_at: int | None,
    timeout_s: float,
    retry_s: float,
) -> None:
    """Raise what the first real connection would (GatewayUnreachable, AuthError, RunRefused), now."""
    info: dict[str, Any] = {"run": run, "probe": True}
    if resume_at is not None:
        info["resume_at"] = resume_at
    give_up = time.monotonic() + retry_s
    while True:
        welcome = asyncio.run(_probe_once(url, site, job, secret, info, timeout_s))
        refused = welcome.get("refused")
        if not isinstance(refused, str):
            return
        if welcome.get("retry") is True and time.monotonic() < give_up:
            time.sleep(RETRY_EVERY_S)
            continue
        raise RunRefused(url, refused)


def probe_failure(
    url: str,
    site: str,
    job: str,
    secret: bytes,
    run: str,
    resume_at: int | None,
    *,
    timeout_s: float,
    retry_s: float,
) -> BaseException | None:
    """:func:`probe_gateway`'s error as a value (None: the gateway will serve this run), for the leader
    to broadcast to its ranks so every rank of the site fails alike."""
    try:
        probe_gateway(
            url, site=site, job=job, secret=secret, run=run, resume_at=resume_at,
            timeout_s=timeout_s, retry_s=retry_s,
        )  # fmt: skip
    except Exception as exc:
        return exc
    return None
