"""Misbehaving clients for the daemon tests: raw garbage, oversized frame headers, wrong secrets, and a fake
peer gateway that authenticates properly and then breaks the rules (or goes silent)."""

from __future__ import annotations

import os
import struct
from typing import Any

from gateways.membership.joining import LinkInfo, rounds_digest
from gateways.rounds.config import RoundConfig
from transports import Transport, connect
from wanrt.errors import AuthError
from wanrt.protocol import NEED_DATA, Connection, MsgType
from wanrt.protocol.frame import MAGIC, encode_frame
from wanrt.protocol.peer.round_frames import GATEWAY_REGISTRY

__all__ = ["FakePeer", "oversized_header", "read_until_closed"]


def oversized_header() -> bytes:
    """A well-formed fixed header announcing a 2 GiB Hello: must be refused before any allocation."""
    return struct.pack(
        "!4sBBHB3sIII", MAGIC, 1, MsgType.HELLO, 0, 0, b"\0\0\0", 1 << 20, (1 << 31) - (1 << 20), 0
    )


async def read_until_closed(transport: Transport) -> bytes:
    """What the server says before it closes (its Error/Reject frame), until EOF."""
    out = bytearray()
    try:
        while data := await transport.recv():
            out += data
    except ConnectionError:
        pass
    return bytes(out)


class FakePeer:
    """A client speaking the gateway protocol as ``site``, with whatever secret it is given."""

    def __init__(self, site: str, job: str, secret: bytes, rounds: RoundConfig) -> None:
        self.site, self.job, self.secret, self.rounds = site, job, secret, rounds

    def info(self) -> dict[str, Any]:
        info = LinkInfo(frontier=-1, fresh=True).to_info()
        info["rounds"] = rounds_digest(self.rounds)
        return info

    async def handshake(self, url: str) -> tuple[Connection, Transport]:
        """Hello → Welcome → Auth; raises AuthError if the gateway does not prove our secret."""
        transport = await connect(url)
        conn = Connection(
            "gateway", self.site, self.job, self.secret, side="client", registry=GATEWAY_REGISTRY
        )
        await transport.send([conn.hello(self.info())])
        while True:
            event = conn.next_event()
            if event is not NEED_DATA:
                break
            conn.receive_data(await transport.recv())
        await transport.send([conn.authenticate()])
        return conn, transport

    async def wrong_secret(self, url: str, *, forge_auth: bool) -> tuple[str, bytes]:
        """Try with a wrong secret: the gateway's Welcome fails our check; then either abort politely (as the
        real client does) or send a forged Auth frame. Returns (our error, what the gateway said)."""
        transport = await connect(url)
        conn = Connection(
            "gateway", self.site, self.job, self.secret, side="client", registry=GATEWAY_REGISTRY
        )
        await transport.send([conn.hello(self.info())])
        error = ""
        said = bytearray()
        try:
            while conn.next_event() is NEED_DATA:
                data = await transport.recv()
                said += data
                conn.receive_data(data)
        except AuthError as exc:
            error = str(exc)
            if forge_auth:
                await transport.send(encode_frame(1, MsgType.AUTH, {"proof": os.urandom(32)}))
            else:
                await transport.send([conn.abort(exc)])
        said += await read_until_closed(transport)
        await transport.close()
        return error, bytes(said)
