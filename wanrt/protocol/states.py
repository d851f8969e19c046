"""The connection state machine as ONE table: (side that sent the message, state, message type) -> new state.

Modelled on h11's ``_state.py``: the rules are data, not scattered ``if``s, so they can be read, documented
(docs/protocol.md reproduces this table) and tested exhaustively. Both endpoints run the same table over
the messages they send and the ones they receive, keyed by which *side* sent each message; the table
therefore needs no "our/their" distinction and the two views can only disagree while a frame is in flight.

Lifecycle::

    START --C:Hello--> HELLO --S:Welcome--> WELCOME --C:Auth--> AUTHENTICATED --any stream msg--> STREAMING
                             --S:Reject---> CLOSED
    AUTHENTICATED/STREAMING --C:Bye--> CLOSING_BY_CLIENT --S:stream msg--> (same) --S:Bye--> CLOSED
    AUTHENTICATED/STREAMING --S:Bye--> CLOSING_BY_SERVER --C:stream msg--> (same) --C:Bye--> CLOSED
    any live state --either:Error or EOF--> CLOSED

Bye is a half close ("I send nothing more"), so the other side can finish in-flight rounds before its own
Bye. ERROR is entered outside the table, on any protocol or authentication error, and is terminal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Final, TypeAlias

from wanrt.protocol.messages import MsgType

__all__ = ["EOF", "HANDSHAKE_STATES", "LIVE_STATES", "Side", "State", "TransitionTable", "transition_table"]


class Side(StrEnum):
    """Who opened the connection. Orthogonal to the Role (gateway, trainer ...)."""

    CLIENT = "client"
    SERVER = "server"

    @property
    def other(self) -> Side:
        return Side.SERVER if self is Side.CLIENT else Side.CLIENT


class State(StrEnum):
    START = "START"  # nothing exchanged yet
    HELLO = "HELLO"  # Hello sent/received, waiting for the server's Welcome or Reject
    WELCOME = "WELCOME"  # Welcome sent/received, waiting for the client's Auth proof
    AUTHENTICATED = "AUTHENTICATED"  # both sides proved the secret; nothing streamed yet
    STREAMING = "STREAMING"
    CLOSING_BY_CLIENT = "CLOSING_BY_CLIENT"  # client said Bye; server may still send, then Bye
    CLOSING_BY_SERVER = "CLOSING_BY_SERVER"  # server said Bye; client may still send, then Bye
    CLOSED = "CLOSED"
    ERROR = "ERROR"


#: States in which frames may still be exchanged (Error is accepted in all of them).
LIVE_STATES: Final = (
    State.START,
    State.HELLO,
    State.WELCOME,
    State.AUTHENTICATED,
    State.STREAMING,
    State.CLOSING_BY_CLIENT,
    State.CLOSING_BY_SERVER,
)

#: States before the peer has proven knowledge of the secret (small frame limit applies).
HANDSHAKE_STATES: Final = (State.START, State.HELLO, State.WELCOME)

#: Pseudo message code for "the peer's byte stream ended", so that EOF is a table entry like any message.
EOF: Final = -1

TransitionTable: TypeAlias = Mapping[tuple[Side, State, int], State]

C, S = Side.CLIENT, Side.SERVER


def transition_table(stream_types: Iterable[int]) -> TransitionTable:
    """The complete table for a registry whose stream message codes are ``stream_types``."""
    table: dict[tuple[Side, State, int], State] = {
        # handshake (auth.py explains what each message proves)
        (C, State.START, MsgType.HELLO): State.HELLO,
        (S, State.HELLO, MsgType.WELCOME): State.WELCOME,
        (S, State.HELLO, MsgType.REJECT): State.CLOSED,
        (C, State.WELCOME, MsgType.AUTH): State.AUTHENTICATED,
        # orderly shutdown: each side half-closes with Bye
        (C, State.AUTHENTICATED, MsgType.BYE): State.CLOSING_BY_CLIENT,
        (C, State.STREAMING, MsgType.BYE): State.CLOSING_BY_CLIENT,
        (S, State.AUTHENTICATED, MsgType.BYE): State.CLOSING_BY_SERVER,
        (S, State.STREAMING, MsgType.BYE): State.CLOSING_BY_SERVER,
        (S, State.CLOSING_BY_CLIENT, MsgType.BYE): State.CLOSED,
        (C, State.CLOSING_BY_SERVER, MsgType.BYE): State.CLOSED,
    }
    # abort: either side, from any live state; and the byte stream ending, clean or not
    for side in (C, S):
        for state in LIVE_STATES:
            table[(side, state, MsgType.ERROR)] = State.CLOSED
            table[(side, state, EOF)] = State.CLOSED
    # data and control plane: both directions once authenticated; the side that has not said Bye yet
    # may keep sending while closing
    for code in stream_types:
        for side in (C, S):
            table[(side, State.AUTHENTICATED, code)] = State.STREAMING
            table[(side, State.STREAMING, code)] = State.STREAMING
        table[(S, State.CLOSING_BY_CLIENT, code)] = State.CLOSING_BY_CLIENT
        table[(C, State.CLOSING_BY_SERVER, code)] = State.CLOSING_BY_SERVER
    return MappingProxyType(table)
