"""Two Connections joined by an in-memory byte link, for handshake, state-machine and fuzz tests.

Nonces come from a seeded counter so that a recorded byte stream can be replayed against a fresh server
that draws the *same* nonce (how the fuzzers get past authentication), or against one that draws a
different nonce (how the replay test shows a recorded handshake is useless).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from wanrt.protocol import (
    NEED_DATA,
    Connection,
    ConnectionClosed,
    Event,
    Hello,
    Message,
    ProtocolConfig,
    Welcome,
)

SECRET = b"pair-test-secret-0123456789"
JOB = "job-1"


def counter_nonces(seed: int) -> Callable[[int], bytes]:
    """Deterministic nonce source: seed and a counter, so two sources with one seed agree."""
    state = {"n": 0}

    def draw(n: int) -> bytes:
        state["n"] += 1
        return (seed.to_bytes(8, "big") + state["n"].to_bytes(8, "big")) * (n // 16) + bytes(n % 16)

    return draw


def drain(conn: Connection, limit: int = 10_000) -> list[Event]:
    """All events available now, ending with NEED_DATA or ConnectionClosed (which are included)."""
    events: list[Event] = []
    for _ in range(limit):
        ev = conn.next_event()
        events.append(ev)
        if ev is NEED_DATA or isinstance(ev, ConnectionClosed):
            return events
    raise AssertionError("next_event() did not settle: a hang")


def feed(conn: Connection, data: bytes | Sequence[bytes], *, step: int | None = None) -> list[Event]:
    """Feed bytes (optionally ``step`` bytes at a time, draining after each) and return the messages."""
    blob = data if isinstance(data, (bytes, bytearray)) else b"".join(bytes(d) for d in data)
    out: list[Event] = []
    if step is None:
        conn.receive_data(bytes(blob))
        out += drain(conn)
    else:
        for i in range(0, len(blob), step):
            conn.receive_data(bytes(blob[i : i + step]))
            out += drain(conn)
    return [e for e in out if e is not NEED_DATA]


@dataclass
class Pair:
    client: Connection
    server: Connection
    #: Everything the client wrote, in order (for replay tests and fuzz corpora).
    client_wire: list[bytes] = field(default_factory=list)
    server_wire: list[bytes] = field(default_factory=list)

    def c2s(self, data: bytes | Sequence[Any], *, step: int | None = None) -> list[Event]:
        blob = data if isinstance(data, bytes) else b"".join(bytes(d) for d in data)
        self.client_wire.append(blob)
        return feed(self.server, blob, step=step)

    def s2c(self, data: bytes | Sequence[Any], *, step: int | None = None) -> list[Event]:
        blob = data if isinstance(data, bytes) else b"".join(bytes(d) for d in data)
        self.server_wire.append(blob)
        return feed(self.client, blob, step=step)

    def send(self, sender: Connection, msg: Message, *, step: int | None = None) -> list[Event]:
        parts = sender.send_parts(msg)
        return self.c2s(parts, step=step) if sender is self.client else self.s2c(parts, step=step)

    def handshake(
        self, client_info: dict[str, Any] | None = None, server_info: dict[str, Any] | None = None
    ) -> tuple[Hello, Welcome]:
        (hello,) = self.c2s(self.client.hello(client_info))
        assert isinstance(hello, Hello)
        (welcome,) = self.s2c(self.server.accept(server_info))
        assert isinstance(welcome, Welcome)
        (auth,) = self.c2s(self.client.authenticate())
        assert self.client.authenticated and self.server.authenticated, auth
        return hello, welcome


def make_pair(
    *,
    client_secret: bytes = SECRET,
    server_secret: bytes = SECRET,
    client_role: str = "trainer",
    server_role: str = "gateway",
    client_job: str = JOB,
    server_job: str = JOB,
    client_config: ProtocolConfig | None = None,
    server_config: ProtocolConfig | None = None,
    client_seed: int = 1,
    server_seed: int = 2,
) -> Pair:
    client = Connection(
        client_role,
        "site-a",
        client_job,
        client_secret,
        side="client",
        config=client_config,
        nonce_source=counter_nonces(client_seed),
        peer="server",
    )
    server = Connection(
        server_role,
        "gw-a",
        server_job,
        server_secret,
        side="server",
        config=server_config,
        nonce_source=counter_nonces(server_seed),
        peer="client",
    )
    return Pair(client, server)


def authenticated_pair(**kwargs: Any) -> Pair:
    pair = make_pair(**kwargs)
    pair.handshake()
    return pair


def messages_only(events: Iterable[Event]) -> list[Message]:
    return [e for e in events if isinstance(e, Message)]
