"""Two gateway-protocol connections, authenticated to each other in memory (test helper)."""

from __future__ import annotations

from wanrt.protocol import Connection
from wanrt.protocol.peer.round_frames import GATEWAY_REGISTRY


def gateway_pair(secret: bytes, job: str = "j") -> tuple[Connection, Connection]:
    """(client "a", server "b") after a complete handshake."""
    c = Connection("gateway", "a", job, secret, side="client", registry=GATEWAY_REGISTRY)
    s = Connection("gateway", "b", job, secret, side="server", registry=GATEWAY_REGISTRY)
    s.receive_data(c.hello({}))
    s.next_event()
    c.receive_data(s.accept({}))
    c.next_event()
    s.receive_data(c.authenticate())
    s.next_event()
    return c, s
