"""The malicious peer of the chaos soak: a client that holds the job secret and breaks the rules.

Copied in spirit from tests/gateways/service/daemon_fakes.py (tools must not import tests/). Every attack
plays a site whose real gateway is down at that moment (so the impersonation is the only link the others
have to it) and reports whether the target gateway *accepted* it: a forged message is accepted if the
gateway kept the link open (it should close it with a reason, DESIGN.md "Trust": a result only from the
parent, nothing outside the iteration window, finite values only) or if a result built from it was
delivered anywhere. A Hello flood is accepted if a never-authenticated connection made the site look up.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import numpy as np

from gateways.membership.joining import LinkInfo, rounds_digest
from gateways.rounds.config import RoundConfig
from transports import Transport, connect
from wanrt.errors import WanrtError
from wanrt.payload import SparsePayload
from wanrt.protocol import NEED_DATA, Connection, Push, Welcome
from wanrt.protocol.peer.round_frames import GATEWAY_REGISTRY, RoundTag

#: how long a gateway may take to close a link that sent a forged message before it counts as accepted
REFUSE_WITHIN_S = 5.0


async def closed_within(transport: Transport, seconds: float) -> bool:
    """Whether the other side closed the connection within ``seconds`` (reading whatever it says)."""
    try:
        async with asyncio.timeout(seconds):
            while await transport.recv():
                pass
        return True
    except TimeoutError:
        return False
    except (ConnectionError, OSError):
        return True


class MaliciousPeer:
    """Speaks the gateway protocol as ``site`` with the right secret and a chosen handshake ``info``."""

    def __init__(self, site: str, job: str, secret: bytes, rounds: RoundConfig) -> None:
        self.site, self.job, self.secret, self.rounds = site, job, secret, rounds
        self.refusals: list[str] = []  # what gateways said when they refused a handshake

    def info(self, *, frontier: int = -1, fresh: bool = True, join_at: int | None = None) -> dict[str, Any]:
        info = LinkInfo(frontier=frontier, fresh=fresh, join_at=join_at).to_info()
        info["rounds"] = rounds_digest(self.rounds)
        return info

    async def handshake(self, url: str, info: dict[str, Any]) -> tuple[Connection, Transport] | str:
        """Hello → Welcome → Auth; or what the gateway said when it refused before its Welcome."""
        transport = await connect(url)
        conn = Connection(
            "gateway", self.site, self.job, self.secret, side="client", registry=GATEWAY_REGISTRY
        )
        await transport.send([conn.hello(info)])
        event: object
        try:
            while True:
                event = conn.next_event()
                if event is not NEED_DATA:
                    break
                conn.receive_data(await transport.recv())
        except (WanrtError, ConnectionError, OSError) as exc:
            event = exc
        if not isinstance(event, Welcome):
            await transport.close()
            self.refusals.append(str(event)[:200])
            return f"refused at the handshake: {str(event)[:120]}"
        await transport.send([conn.authenticate()])
        return conn, transport

    async def far_join(self, url: str, frontier: int) -> bool:
        """Claim a join iteration 500 past the job: accepted if the link stays open."""
        got = await self.handshake(url, self.info(frontier=frontier, fresh=False, join_at=frontier + 500))
        if isinstance(got, str):
            return False
        _, transport = got
        try:
            return not await closed_within(transport, REFUSE_WITHIN_S)
        finally:
            await transport.close()

    async def forged_round(
        self, url: str, *, kind: str, iteration: int, layer: int, payload: SparsePayload, plan_id: int = 0
    ) -> bool:
        """Send one round message (a ``final`` from a non-parent, a NaN ``partial``...) after a proper
        handshake; accepted if the link stays open (the caller also checks no delivery used it)."""
        got = await self.handshake(url, self.info())
        if isinstance(got, str):
            return False
        conn, transport = got
        try:
            await asyncio.sleep(0.2)  # let the link come up on the gateway's side first
            tag = RoundTag(1, kind, iteration, layer, plan_id, 0, -1, ((self.site, iteration),), True)
            await transport.send(conn.send_parts(tag))
            await transport.send(conn.send_parts(Push(self.job, iteration, layer, 1, self.site, payload)))
            return not await closed_within(transport, REFUSE_WITHIN_S)
        except (ConnectionError, OSError):
            return False
        finally:
            with contextlib.suppress(Exception):
                await transport.close()

    async def hello_flood(self, url: str, n: int) -> list[Transport]:
        """``n`` connections that send a Hello naming the site and never authenticate (kept open)."""
        out = []
        for _ in range(n):
            t = await connect(url)
            conn = Connection("gateway", self.site, self.job, b"x" * 32, side="client")
            with contextlib.suppress(ConnectionError, OSError):
                await t.send([conn.hello(self.info())])
            out.append(t)
        return out


def nan_payload(layer: int, dense_len: int, block: int) -> SparsePayload:
    dense = np.full(dense_len, np.nan, np.float32)
    idx = np.arange(0, max(1, dense_len // block), dtype=np.int64)[:2]
    return SparsePayload.from_dense_blocks(layer, dense, idx, block)


def finite_payload(layer: int, dense_len: int, block: int) -> SparsePayload:
    dense = np.full(dense_len, 1000.0, np.float32)
    idx = np.arange(0, max(1, dense_len // block), dtype=np.int64)[:2]
    return SparsePayload.from_dense_blocks(layer, dense, idx, block)
