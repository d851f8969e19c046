"""The sans-IO connection: bytes in, messages out; messages in, bytes out. No sockets, no clocks, no asyncio.

Modelled on h11's ``Connection``: the caller moves bytes (``receive_data`` / the return values of ``send``),
the object enforces the protocol. Every state change is a lookup in the one table of
:mod:`wanrt.protocol.states`; any protocol or authentication error moves the connection to ``ERROR``, after
which ``send`` and ``next_event`` raise and only :meth:`Connection.abort` (one last Error/Reject frame for
the peer) is allowed. A refused *send* also ends in ERROR: the caller's idea of the protocol and ours
disagree, and continuing would only hide that.

Typical client::

    conn = Connection("trainer", "site-a", "job1", secret, side="client")
    await t.send([conn.hello(info={"model": sig})])
    ... feed t.recv() into conn.receive_data until conn.next_event() returns Welcome ...
    await t.send([conn.authenticate()])
    await t.send(conn.send_parts(Push(...)))

Typical server: ``next_event() -> Hello``, ``send(accept())`` (or ``reject(...)``), ``next_event() -> Auth``;
from then on both sides stream.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any, Final

from wanrt.errors import (
    AuthError,
    ConfigError,
    LimitExceeded,
    LocalProtocolError,
    MalformedPayload,
    ProtocolError,
    RemoteProtocolError,
    WanrtError,
)
from wanrt.protocol.auth import client_proof, proof_matches, server_proof
from wanrt.protocol.checks import check_name
from wanrt.protocol.chunks import Reassembler
from wanrt.protocol.config import ProtocolConfig
from wanrt.protocol.events import NEED_DATA, ConnectionClosed, Event
from wanrt.protocol.frame import FixedHeader, FrameReader, decode_frame_body, encode_frame, parse_fixed_header
from wanrt.protocol.limits import (
    FIXED_HEADER_BYTES,
    MAX_HANDSHAKE_FRAME_BYTES,
    MAX_SECRET_BYTES,
    MAX_STR_CHARS,
    MIN_SECRET_BYTES,
    NONCE_BYTES,
)
from wanrt.protocol.messages import (
    PROOF_BYTES,
    Auth,
    Bye,
    Chunk,
    ChunkCancel,
    Error,
    ErrorCode,
    Hello,
    Message,
    Reject,
    Role,
    Welcome,
    decode_message,
)
from wanrt.protocol.registry import CORE_REGISTRY, MessageRegistry
from wanrt.protocol.states import EOF, HANDSHAKE_STATES, Side, State, TransitionTable, transition_table

__all__ = ["Connection"]

_PRE_AUTH: Final = frozenset(HANDSHAKE_STATES)


@lru_cache(maxsize=32)
def _table(stream_types: frozenset[int]) -> TransitionTable:
    return transition_table(sorted(stream_types))


def _error_code(error: BaseException | None) -> int:
    if error is None:
        return ErrorCode.SHUTDOWN
    if isinstance(error, WanrtError) and isinstance(error.fields.get("code"), int):
        return int(error.fields["code"])
    if isinstance(error, AuthError):
        return ErrorCode.AUTH
    if isinstance(error, LimitExceeded):
        return ErrorCode.LIMIT
    if isinstance(error, MalformedPayload):
        return ErrorCode.PAYLOAD
    if isinstance(error, ProtocolError):
        return ErrorCode.PROTOCOL
    return ErrorCode.INTERNAL


class Connection:
    """One end of a wanrt connection (see the module docstring).

    ``role`` is what we are (gateway, trainer, scheduler, observer), ``side`` who opened the connection.
    ``nonce_source`` exists so that tests can make handshakes deterministic; never fix it in production,
    fresh nonces are what makes a recorded handshake useless. ``peer`` labels errors until the peer's site
    name is known.
    """

    def __init__(
        self,
        role: Role | str,
        our_site: str,
        job: str,
        secret: bytes,
        *,
        side: Side | str,
        config: ProtocolConfig | None = None,
        registry: MessageRegistry = CORE_REGISTRY,
        nonce_source: Callable[[int], bytes] = os.urandom,
        peer: str | None = None,
    ) -> None:
        try:
            self.role = Role(role)
        except ValueError:
            raise ConfigError(f"unknown role {role!r}", key="role", value=role) from None
        try:
            self.side = Side(side)
        except ValueError:
            raise ConfigError(
                f"side must be 'client' or 'server', not {side!r}", key="side", value=side
            ) from None
        for key, value in (("site", our_site), ("job", job)):
            try:
                check_name(value, key)
            except LocalProtocolError as exc:
                raise ConfigError(exc.message, key=key, value=value) from None
        if not isinstance(secret, bytes) or not MIN_SECRET_BYTES <= len(secret) <= MAX_SECRET_BYTES:
            raise ConfigError(
                f"job secret must be {MIN_SECRET_BYTES}..{MAX_SECRET_BYTES} bytes "
                "(shorter keys can be brute-forced from one recorded handshake)",
                key="secret",
            )
        self._their_side = self.side.other
        self.site: str = our_site
        self.job: str = job
        self._secret = secret
        self.config = config if config is not None else ProtocolConfig()
        self.registry = registry
        self._by_type: dict[int, type[Message]] = dict(registry.types)  # a plain dict: looked up per frame
        self._table = _table(registry.stream_types)
        self._nonce_source = nonce_source
        self._peer_label = peer
        self.state: State = State.START
        #: Negotiated protocol version (None until Welcome has been sent/received).
        self.version: int | None = None
        self.peer_site: str | None = None
        self.peer_role: Role | None = None
        self.peer_info: dict[str, Any] = {}
        #: Largest frame the peer accepts (known after the handshake).
        self.peer_max_frame: int = MAX_HANDSHAKE_FRAME_BYTES
        #: The error that moved the connection to ERROR, for logs.
        self.error: BaseException | None = None
        #: Why the peer ended the session (its Bye/Reject/Error), if it did.
        self.close_reason: Message | None = None
        self._hello: Hello | None = None
        self._welcome: Welcome | None = None
        self._chosen: int | None = None
        self._aborted = False
        self._reader = FrameReader(peer=peer)
        self._reassembler = (
            Reassembler(
                max_items=self.config.max_partial_items,
                max_item_bytes=self.config.max_frame_bytes,
                max_bytes=self.config.max_reassembly_bytes,
                peer=peer,
            )
            if self.config.reassemble_chunks
            else None
        )

    # ------------------------------------------------------------------------------------------ queries

    @property
    def their_side(self) -> Side:
        return self._their_side

    @property
    def authenticated(self) -> bool:
        """True once both sides have proven the secret (stays True while closing)."""
        return self.state in (
            State.AUTHENTICATED,
            State.STREAMING,
            State.CLOSING_BY_CLIENT,
            State.CLOSING_BY_SERVER,
        )

    @property
    def pending_chunked_items(self) -> int:
        return self._reassembler.pending if self._reassembler is not None else 0

    @property
    def frame_bytes_missing(self) -> int:
        """Bytes still to arrive before the frame being received is complete (0: between frames, or its
        length not known yet): nothing can be decoded before they are here."""
        return self._reader.missing

    @property
    def held_bytes(self) -> int:
        """Receive buffers this connection holds (partial frame, unread chunks, chunked items)."""
        reassembling = self._reassembler.reserved_bytes if self._reassembler is not None else 0
        return self._reader.held_bytes + reassembling

    def release_buffers(self) -> None:
        """Free every receive buffer at once; called when the connection ends (EOF, an error, an abort),
        so a closed link's memory is given back at close, not when the last reference goes."""
        self._reader.discard()
        if self._reassembler is not None:
            self._reassembler.clear()

    @property
    def unread_bytes(self) -> int:
        """Bytes received but not yet cut into frames: right after a message is handed out, the bytes
        received less these is the stream position of its last byte (a receiver's per-message arrival
        times, gateways/sending/rx_dispersion.py)."""
        return self._reader.unread

    def _peer(self) -> str | None:
        return self._peer_label or self.peer_site

    # -------------------------------------------------------------------------------------- handshake API

    def _fresh_nonce(self) -> bytes:
        nonce = self._nonce_source(NONCE_BYTES)
        if not isinstance(nonce, bytes) or len(nonce) != NONCE_BYTES:
            raise LocalProtocolError(f"nonce source must return {NONCE_BYTES} bytes")
        return nonce

    def hello(self, info: Mapping[str, Any] | None = None) -> bytes:
        """Client: the opening frame, with a fresh nonce and our versions and frame limit."""
        msg = Hello(
            self.job,
            self.site,
            self.role,
            self.config.versions,
            self._fresh_nonce(),
            self.config.max_frame_bytes,
            dict(info or {}),
        )
        return self.send(msg)

    def accept(self, info: Mapping[str, Any] | None = None, *, secret: bytes | None = None) -> bytes:
        """Server, after a Hello event: the Welcome frame with our proof and the negotiated version.

        ``secret``: the key for the peer the Hello names (per-site keys, :mod:`wanrt.keys`); it replaces
        the one given at construction for the whole handshake."""
        if self.state is not State.HELLO or self._hello is None or self._chosen is None:
            raise LocalProtocolError("accept() needs a received Hello", value=str(self.state))
        if secret is not None:
            if not isinstance(secret, bytes) or not MIN_SECRET_BYTES <= len(secret) <= MAX_SECRET_BYTES:
                raise ConfigError(
                    f"secret must be {MIN_SECRET_BYTES}..{MAX_SECRET_BYTES} bytes", key="secret"
                )
            self._secret = secret
        unsigned = Welcome(
            self.job,
            self.site,
            self.role,
            self.config.versions,
            self._chosen,
            self._fresh_nonce(),
            bytes(PROOF_BYTES),
            self.config.max_frame_bytes,
            dict(info or {}),
        )
        return self.send(
            dataclasses.replace(unsigned, proof=server_proof(self._secret, self._hello, unsigned))
        )

    def reject(self, code: int, reason: str) -> bytes:
        """Server, after a Hello event: turn the client away (it will see a Reject event)."""
        return self.send(Reject(code, reason, self.config.versions))

    def authenticate(self) -> bytes:
        """Client, after a Welcome event (whose proof was already verified): our own proof."""
        if self._hello is None or self._welcome is None:
            raise LocalProtocolError("authenticate() needs a received Welcome", value=str(self.state))
        return self.send(Auth(client_proof(self._secret, self._hello, self._welcome)))

    # ------------------------------------------------------------------------------------------- sending

    def send(self, msg: Message) -> bytes:
        """Frame ``msg`` into one bytes object (copies payload buffers: use send_parts for big ones)."""
        return b"".join(self.send_parts(msg))

    def send_parts(self, msg: Message) -> list[memoryview]:
        """Frame ``msg`` as ``[header, *payload buffers]`` for ``writelines``; buffers are not copied, so the
        payload must stay unchanged until written."""
        if self.state is State.ERROR or self.state is State.CLOSED:
            self._check_usable()
        try:
            cls = type(msg)
            if self._by_type.get(getattr(cls, "TYPE", -1)) is not cls:  # `cls in self.registry`, inlined
                raise LocalProtocolError(f"{cls.__name__} is not a registered message type")
            new = self._table.get((self.side, self.state, cls.TYPE))
            if new is None:
                raise LocalProtocolError(
                    f"the {self.side} may not send {cls.__name__} in state {self.state}",
                    value=str(self.state),
                )
            if cls.STREAM:  # data and control after the handshake: nothing to check or remember
                header, buffers = msg.to_wire()
                limit = MAX_HANDSHAKE_FRAME_BYTES if self.state in _PRE_AUTH else self.peer_max_frame
                parts = encode_frame(self._stamp(), cls.TYPE, header, buffers, max_frame=limit)
                self.state = new
                return parts
            self._before_send(msg)
            header, buffers = msg.to_wire()
            version = msg.version if isinstance(msg, Welcome) else self._stamp()
            limit = MAX_HANDSHAKE_FRAME_BYTES if self.state in _PRE_AUTH else self.peer_max_frame
            parts = encode_frame(version, cls.TYPE, header, buffers, max_frame=limit)
        except (ProtocolError, AuthError) as exc:
            self._fail(exc)
            raise
        self._after_send(msg)
        self.state = new
        return parts

    def send_header(
        self, cls: type[Message], header: Mapping[str, Any], buffers: list[memoryview]
    ) -> list[memoryview]:
        """Frame a stream message given as its wire form (``cls.to_wire()``'s header and buffers), for a
        sender that builds that form directly instead of a message object (the gateways' per-message
        path, where the frozen dataclass's ``__init__`` cost more than framing). The same state check
        as :meth:`send_parts`; the caller vouches that the form is one ``cls`` would produce."""
        if self.state is State.ERROR or self.state is State.CLOSED:
            self._check_usable()
        try:
            if self._by_type.get(getattr(cls, "TYPE", -1)) is not cls:
                raise LocalProtocolError(f"{cls.__name__} is not a registered message type")
            if not cls.STREAM:
                raise LocalProtocolError(f"{cls.__name__} is not a stream message: use send_parts")
            new = self._table.get((self.side, self.state, cls.TYPE))
            if new is None:
                raise LocalProtocolError(
                    f"the {self.side} may not send {cls.__name__} in state {self.state}",
                    value=str(self.state),
                )
            limit = MAX_HANDSHAKE_FRAME_BYTES if self.state in _PRE_AUTH else self.peer_max_frame
            parts = encode_frame(self._stamp(), cls.TYPE, header, buffers, max_frame=limit)
        except (ProtocolError, AuthError) as exc:
            self._fail(exc)
            raise
        self.state = new
        return parts

    def abort(
        self, error: BaseException | None = None, *, code: int | None = None, message: str = ""
    ) -> bytes:
        """The last frame for the peer: a Reject if we are a server that has not welcomed it yet, else an
        Error. Allowed in every state, including ERROR; returns b"" when there is nobody left to tell."""
        if self._aborted or self.state is State.CLOSED:
            return b""
        code = _error_code(error) if code is None else code
        text = (message or (str(error) if error is not None else "") or "aborted")[:MAX_STR_CHARS]
        msg: Message
        if self.side is Side.SERVER and self._hello is not None and self._welcome is None:
            msg = Reject(code, text, self.config.versions)
        else:
            msg = Error(code, text)
        header, _ = msg.to_wire()
        frame = b"".join(encode_frame(self._stamp(), msg.TYPE, header, max_frame=MAX_HANDSHAKE_FRAME_BYTES))
        self._aborted = True
        if self.state is not State.ERROR:
            self.state = self._table.get((self.side, self.state, msg.TYPE), State.CLOSED)
        if self.state in (State.ERROR, State.CLOSED):  # nothing more will be read
            self.release_buffers()
        return frame

    def _stamp(self) -> int:
        return self.version if self.version is not None else max(self.config.versions)

    def _check_usable(self) -> None:
        if self.state is State.ERROR:
            raise LocalProtocolError(
                "connection is in the ERROR state", peer=self._peer(), value=repr(self.error)
            )
        if self.state is State.CLOSED:
            raise LocalProtocolError("connection is closed", peer=self._peer())

    def _before_send(self, msg: Message) -> None:
        if isinstance(msg, Hello):
            if (msg.job, msg.site, msg.role) != (self.job, self.site, self.role):
                raise LocalProtocolError("Hello must carry this connection's job, site and role")
        elif isinstance(msg, Welcome):
            assert self._hello is not None  # the table admits Welcome only after a Hello
            if (msg.job, msg.site, msg.role) != (
                self.job,
                self.site,
                self.role,
            ) or msg.version != self._chosen:
                raise LocalProtocolError("Welcome must carry our job, site, role and the negotiated version")
            if not proof_matches(server_proof(self._secret, self._hello, msg), msg.proof):
                raise LocalProtocolError("Welcome proof is not ours (use accept())")
        elif isinstance(msg, Auth):
            assert self._hello is not None and self._welcome is not None
            if not proof_matches(client_proof(self._secret, self._hello, self._welcome), msg.proof):
                raise LocalProtocolError("Auth proof is not ours (use authenticate())")

    def _after_send(self, msg: Message) -> None:
        if isinstance(msg, Hello):
            self._hello = msg
        elif isinstance(msg, Welcome):
            self._welcome = msg
            self.version = msg.version

    # ----------------------------------------------------------------------------------------- receiving

    def receive_data(self, data: bytes) -> None:
        """Hand over bytes read from the transport; ``b""`` means the peer closed its side (EOF).

        Ignored once the connection is in ERROR or CLOSED (the caller may still be draining its socket).
        """
        if self.state in (State.ERROR, State.CLOSED):
            return
        if self._reader.eof:
            raise LocalProtocolError("receive_data() after EOF", peer=self._peer())
        self._reader.feed(data)

    def next_event(self) -> Event:
        """The next message from the peer, NEED_DATA, or ConnectionClosed (repeatedly, once closed).

        Raises RemoteProtocolError / LimitExceeded / MalformedPayload / AuthError when the peer breaks the
        protocol (the connection is then in ERROR: send ``abort(exc)`` and close the transport).
        """
        if self.state is State.ERROR:
            raise LocalProtocolError(
                "connection is in the ERROR state", peer=self._peer(), value=repr(self.error)
            )
        if self.state is State.CLOSED:
            return ConnectionClosed(clean=self.close_reason is not None, reason=self._reason_text())
        try:
            return self._next_event()
        except (ProtocolError, AuthError) as exc:
            self._fail(exc)
            raise

    def _next_event(self) -> Event:
        while True:
            frame = self._reader.next_frame(self._admit)
            if frame is None:
                if not self._reader.eof:
                    return NEED_DATA
                if self._reader.mid_frame:
                    raise RemoteProtocolError("connection closed in the middle of a frame", peer=self._peer())
                self.state = self._table[(self.their_side, self.state, EOF)]
                self.release_buffers()
                return ConnectionClosed(clean=self.close_reason is not None, reason=self._reason_text())
            cls = self._by_type.get(frame.msg_type)
            assert cls is not None  # _admit refused unknown types
            msg = decode_message(cls, frame.header, frame.buffers, peer=self._peer())
            if self._reassembler is not None and isinstance(msg, (Chunk, ChunkCancel)):
                self._apply(msg)
                if isinstance(msg, ChunkCancel):
                    self._reassembler.cancel(msg.item_id)
                    continue
                item = self._reassembler.add(msg)
                if item is None:
                    continue
                msg = self._decode_item(item)
            self._on_received(msg, frame.version)
            return msg

    def _decode_item(self, item: memoryview) -> Message:
        """A reassembled item is one whole frame; it passes the same admission checks as any frame."""
        if len(item) < FIXED_HEADER_BYTES:
            raise RemoteProtocolError("chunked item shorter than a frame header", peer=self._peer())
        fixed_bytes = item[:FIXED_HEADER_BYTES]
        fixed = parse_fixed_header(fixed_bytes, peer=self._peer())
        cls = self.registry.get(fixed.msg_type)
        if cls is Chunk or cls is ChunkCancel:
            raise RemoteProtocolError("chunk inside a chunked item", peer=self._peer())
        self._admit(fixed)
        frame = decode_frame_body(fixed, fixed_bytes, item[FIXED_HEADER_BYTES:], peer=self._peer())
        assert cls is not None
        return decode_message(cls, frame.header, frame.buffers, peer=self._peer())

    def _admit(self, fixed: FixedHeader) -> None:
        """Vet a frame from its 24-byte header alone, before its body is buffered."""
        if fixed.flags:
            raise RemoteProtocolError("unknown flag bits set", peer=self._peer(), value=fixed.flags)
        if self.version is not None and fixed.version != self.version:
            raise RemoteProtocolError(
                "frame version differs from the negotiated one",
                peer=self._peer(),
                value=fixed.version,
                limit=self.version,
            )
        cls = self._by_type.get(fixed.msg_type)
        if cls is None:
            raise RemoteProtocolError("unknown message type", peer=self._peer(), value=fixed.msg_type)
        state = self.state
        if (self._their_side, state, fixed.msg_type) not in self._table:
            raise RemoteProtocolError(
                f"the {self.their_side} may not send {cls.__name__} in state {state}",
                peer=self._peer(),
                value=str(state),
            )
        limit = MAX_HANDSHAKE_FRAME_BYTES if state in _PRE_AUTH else self.config.max_frame_bytes
        frame_len = FIXED_HEADER_BYTES + fixed.header_len + fixed.pad + fixed.body_len
        if frame_len > limit:
            raise LimitExceeded(
                f"{cls.__name__} frame too large",
                name="max_frame_bytes",
                limit=limit,
                value=frame_len,
                peer=self._peer(),
            )
        if fixed.body_len and not cls.MAX_BUFFERS:
            raise RemoteProtocolError(
                f"{cls.__name__} frames carry no body", peer=self._peer(), value=fixed.body_len
            )

    def _apply(self, msg: Message) -> None:
        self.state = self._table[(self.their_side, self.state, msg.TYPE)]

    def _on_received(self, msg: Message, frame_version: int) -> None:
        new = self._table.get((self.their_side, self.state, msg.TYPE))
        if new is None:  # a reassembled item's inner type
            raise RemoteProtocolError(
                f"{type(msg).__name__} not allowed in state {self.state}", peer=self._peer()
            )
        if msg.STREAM:  # none of the handshake or closing messages below
            self.state = new
            return
        if isinstance(msg, Hello):
            self._received_hello(msg)
        elif isinstance(msg, Welcome):
            self._received_welcome(msg, frame_version)
        elif isinstance(msg, Auth):
            self._received_auth(msg)
        elif isinstance(msg, Bye):
            if self.pending_chunked_items:
                raise RemoteProtocolError(
                    "Bye with chunked items unfinished", peer=self._peer(), value=self.pending_chunked_items
                )
            self.close_reason = msg
        elif isinstance(msg, (Reject, Error)):
            self.close_reason = msg
        self._apply(msg)

    def _received_hello(self, hello: Hello) -> None:
        self._hello = hello
        self.peer_site, self.peer_role, self.peer_info = hello.site, hello.role, hello.info
        if hello.job != self.job:
            raise AuthError(
                "client asked for a job this server does not serve", peer=self._peer(), value=hello.job
            )
        common = set(hello.versions) & set(self.config.versions)
        if not common:
            raise RemoteProtocolError(
                "no common protocol version",
                peer=self._peer(),
                value=hello.versions,
                limit=self.config.versions,
                code=ErrorCode.VERSION,
            )
        self._chosen = max(common)

    def _received_welcome(self, welcome: Welcome, frame_version: int) -> None:
        hello = self._hello
        assert hello is not None  # the table admits Welcome only after our Hello
        if not proof_matches(server_proof(self._secret, hello, welcome), welcome.proof):
            raise AuthError(
                "server proof invalid: wrong job secret, or a replayed/forged Welcome", peer=self._peer()
            )
        if welcome.job != self.job:
            raise AuthError("server serves another job", peer=self._peer(), value=welcome.job)
        common = set(hello.versions) & set(welcome.versions)
        if not common or welcome.version != max(common) or frame_version != welcome.version:
            raise RemoteProtocolError(
                "server did not choose the highest common version",
                peer=self._peer(),
                value=welcome.version,
                code=ErrorCode.VERSION,
            )
        self._welcome = welcome
        self.version = welcome.version
        self.peer_site, self.peer_role, self.peer_info = welcome.site, welcome.role, welcome.info
        self.peer_max_frame = welcome.max_frame

    def _received_auth(self, auth: Auth) -> None:
        assert self._hello is not None and self._welcome is not None
        if not proof_matches(client_proof(self._secret, self._hello, self._welcome), auth.proof):
            raise AuthError(
                "client proof invalid: wrong job secret, or a replayed handshake", peer=self._peer()
            )
        self.peer_max_frame = self._hello.max_frame

    def _fail(self, exc: BaseException) -> None:
        self.state = State.ERROR
        self.error = exc
        self.release_buffers()

    def _reason_text(self) -> str:
        r = self.close_reason
        if isinstance(r, Bye):
            return r.reason
        if isinstance(r, Reject):
            return r.reason
        if isinstance(r, Error):
            return r.message
        return "peer closed the connection without Bye"
