"""Getting gateway-to-gateway links up: listening, dialing with backoff, the handshake, emulated shaping.

One authenticated connection per pair of sites: the lexicographically *smaller* site dials, the larger one
accepts (so two gateways never race each other into two connections, and a misconfigured dialer is refused
with a reason). The dialing side reconnects with exponential backoff (``reconnect_initial_s`` growing by
``reconnect_factor`` up to ``reconnect_max_s``, back to the start after a link was up).

The handshake is the protocol's (role ``gateway``, HMAC proofs of the job secret); the ``info`` maps carry
what :mod:`gateways.membership.joining` and :mod:`gateways.membership.job_model` need, and are decided by
the node so that this file stays an adapter. While the node has not joined the job yet, handshakes are
serialised (:meth:`LinksOwner.handshake_gate`): a fresh gateway's first link fixes the iteration it joins
at, and every later link must see that decision. Unauthenticated connections are capped: at most
:data:`MAX_PREAUTH_PER_HOST` per remote host and :data:`MAX_PREAUTH_TOTAL` in all. When all slots are
taken, a connection from a host holding fewer of them than the busiest host evicts that host's oldest
handshake (fair share): a few hosts (8 × 8 filled every slot and blocked every rejoin, security probe of
issue 21) cannot exhaust the listener while a peer from another address still gets in; only a flood from
about as many hosts as there are slots can.
(Known limit: before it has joined, a gateway still holds that gate while a peer that has not proved the
secret yet answers its Welcome, for up to the handshake timeout.)

A peer that fails authentication, breaks the protocol in its handshake or sends garbage only loses its own
connection, with a log line saying why; the listener keeps accepting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from contextlib import AbstractAsyncContextManager
from typing import Any, Final, Protocol

from gateways.config import GatewayConfig
from gateways.service.peer_link import PeerLink
from transports import Listener, ShapedTransport, Transport, connect, listen, parse_url
from transports.connection_io import next_event
from transports.handshake_boundary import HandshakeFailure, handshake_boundary
from wanrt.errors import AuthError, RemoteProtocolError, TransportError, WanrtTimeout
from wanrt.keys import Credentials
from wanrt.protocol import Auth, Connection, Error, ErrorCode, Hello, Reject, Role, Welcome
from wanrt.protocol.peer.round_frames import GATEWAY_REGISTRY

__all__ = ["MAX_PREAUTH_PER_HOST", "MAX_PREAUTH_TOTAL", "LinksOwner", "PeerLinks"]

log = logging.getLogger(__name__)


#: Handshakes in progress from one remote host (TCP; unix peers share one "host"): a job has at most a few
#: gateways per host, each with one link to us, so anything beyond is a flood.
MAX_PREAUTH_PER_HOST: Final = 8
#: Handshakes in progress in all: bounds the memory and tasks an unauthenticated flood can hold.
MAX_PREAUTH_TOTAL: Final = 64


class LinksOwner(Protocol):
    """The daemon, as the link manager needs it."""

    def handshake_gate(self) -> AbstractAsyncContextManager[None]: ...

    def dialer_problem(self, hello: Hello) -> str | None:
        """Why a connecting gateway is refused (``None``: accept)."""
        ...

    def link_info(self, peer: str) -> dict[str, Any]:
        """Our handshake ``info`` for ``peer`` (kept by the caller: the join rule uses what was sent)."""
        ...

    def link_epoch(self) -> int:
        """Changes whenever ``link_info`` could (a handshake that straddles a change is redone)."""
        ...

    def link_up(
        self, peer: str, conn: Connection, transport: Transport, ours: dict[str, Any], theirs: dict[str, Any]
    ) -> PeerLink:
        """Authenticated: build and register the link (may raise RemoteProtocolError to refuse it)."""
        ...

    def link_down(self, link: PeerLink) -> None: ...

    def rejected(self, who: str, why: str, site: str | None = None, *, kind: str = "config") -> None: ...


class PeerLinks:
    """The peer listener and the dial loops of one gateway (see the module docstring)."""

    def __init__(self, cfg: GatewayConfig, owner: LinksOwner, creds: Credentials) -> None:
        self.cfg = cfg
        self._owner = owner
        self._creds = creds
        self._listener: Listener | None = None
        self._dialers: dict[str, asyncio.Task[None]] = {}
        self._serving: set[asyncio.Task[Any]] = set()
        self._stop = asyncio.Event()
        self._preauth: dict[str, list[_Slot]] = {}  # remote host -> handshakes in progress, oldest first

    @property
    def url(self) -> str | None:
        return None if self._listener is None else self._listener.url

    async def start(self) -> None:
        cfg = self.cfg
        base = parse_url(cfg.listen).url  # shaping is per peer ([gateway.shaping.NAME]), applied at link-up
        self._listener = await listen(base, self._accept, tls=cfg.tls, timeouts=cfg.timeouts)
        loop = asyncio.get_running_loop()
        for peer in sorted(cfg.peers):
            if cfg.site < peer:
                self._dialers[peer] = loop.create_task(self._dial_loop(peer), name=f"dial {peer}")

    def stop_accepting(self) -> None:
        """Phase 1 of shutdown: no new connections, no reconnects; live links keep running."""
        self._stop.set()
        if self._listener is not None:
            self._listener.close()

    async def aclose(self) -> None:
        """End the dial loops and the links they serve: give them the close grace to end on their own (the
        links were closed or aborted by now, and a dial loop stops once shutdown is flagged), then cancel
        what is left; close the listener.

        Not cancelling at once matters twice: a link that is still flushing its Bye through an emulated
        link would lose it, and cancelling the task of an accepted connection makes asyncio's stream
        server log a spurious error (Python 3.11)."""
        self.stop_accepting()
        tasks = [*self._dialers.values(), *self._serving]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=self.cfg.timeouts.close)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        if self._listener is not None:
            await self._listener.wait_closed()

    # -- shaping ------------------------------------------------------------------------------------

    def shaped(self, peer: str, transport: Transport) -> Transport:
        """What we send to ``peer`` goes through its emulated WAN link, if the config has one."""
        shape = self.cfg.shaping.get(peer) or parse_url(self.cfg.peers[peer]).shape
        if shape is None:
            return transport
        return ShapedTransport(transport, shape, timeouts=self.cfg.timeouts)

    # -- accepting ----------------------------------------------------------------------------------

    def _connection(self, side: str, label: str, peer: str | None = None) -> Connection:
        """With per-site keys, a dialer proves with the key of the pair it dials; a listener picks the pair
        key once the Hello names the dialer (``accept(secret=...)``)."""
        key = self._creds.for_peer(peer) if peer is not None else None
        return Connection(
            Role.GATEWAY,
            self.cfg.site,
            self.cfg.job,
            key if key is not None else self._creds.placeholder(),
            side=side,
            registry=GATEWAY_REGISTRY,
            peer=label,
        )

    async def _accept(self, transport: Transport) -> None:
        """Listener handler: server side of the handshake, then serve the link."""
        slot = self._take_slot(_host_of(transport.peer))
        if slot is None:
            self._owner.rejected(transport.peer, "too many unauthenticated connections; closed")
            with contextlib.suppress(TransportError, OSError):
                await transport.close()
            return
        try:
            link = await self._accept_handshake(transport, slot)
        finally:
            self._release(slot)
        if link is not None:
            await self._serve(link)

    def _take_slot(self, host: str) -> _Slot | None:
        """A pre-authentication slot for a connection from ``host``, evicting the busiest host's oldest
        handshake when every slot is taken and that host holds more than one more than ``host`` (None:
        refused). See the module docstring."""
        mine = len(self._preauth.get(host, ()))
        if mine >= MAX_PREAUTH_PER_HOST:
            return None
        if sum(len(v) for v in self._preauth.values()) >= MAX_PREAUTH_TOTAL:
            busiest = max(self._preauth, key=lambda h: len(self._preauth[h]))
            if len(self._preauth[busiest]) <= mine + 1:
                return None
            victim = self._preauth[busiest][0]
            self._release(victim)
            victim.evict()
        slot = _Slot(host)
        self._preauth.setdefault(host, []).append(slot)
        return slot

    def _release(self, slot: _Slot) -> None:
        pending = self._preauth.get(slot.host)
        if pending is not None and slot in pending:
            pending.remove(slot)
            if not pending:
                del self._preauth[slot.host]

    async def _accept_handshake(self, transport: Transport, slot: _Slot) -> PeerLink | None:
        conn = self._connection("server", transport.peer)
        site: str | None = None

        def failed(f: HandshakeFailure) -> None:
            if f.kind == "timeout":
                why = (
                    "unauthenticated handshake evicted: every slot was taken and this host held the most"
                    if slot.evicted
                    else "handshake not finished in time"
                )
                self._owner.rejected(transport.peer, why)
            elif f.kind == "refused":
                self._owner.rejected(transport.peer, str(f), site, kind="auth" if f.auth else "config")
            else:
                log.info("gateway connection from %s ended during the handshake: %s", transport.peer, f)

        async with handshake_boundary(conn, transport, grace=self.cfg.timeouts.close, on_failure=failed):
            async with asyncio.timeout(self.cfg.timeouts.handshake) as deadline:
                slot.deadline = deadline
                if slot.evicted:
                    raise TimeoutError
                hello = await next_event(conn, transport)
                if not isinstance(hello, Hello):
                    raise TransportError("closed before its Hello", peer=transport.peer)
                problem = self._owner.dialer_problem(hello)
                if problem is not None:
                    await transport.send([conn.reject(ErrorCode.AUTH, problem)])
                    raise AuthError(problem, peer=hello.site)
                # The gate (held only before this gateway joined) is never held while waiting for an
                # unauthenticated dialer: what we tell it is fixed under the gate, and if another link
                # came up before its Auth arrived, what we told it is stale and it must dial again.
                async with self._owner.handshake_gate():
                    if self._stop.is_set():
                        await transport.send([conn.reject(ErrorCode.SHUTDOWN, "gateway shutting down")])
                        raise TransportError("refused: shutting down", peer=hello.site)
                    ours = self._owner.link_info(hello.site)
                    epoch = self._owner.link_epoch()
                    key = self._creds.for_peer(hello.site)
                    if key is None:  # dialer_problem refused non-peers already
                        raise AuthError(f"no key for site {hello.site!r}", peer=hello.site)
                    await transport.send([conn.accept(ours, secret=key)])
                auth = await next_event(conn, transport)
                _expect_auth(auth, hello.site)
                site = hello.site  # authenticated: from here on it is that site speaking
                self._release(slot)  # no longer pre-authentication: never evicted from here on
                async with self._owner.handshake_gate():
                    if self._owner.link_epoch() != epoch:
                        raise TransportError(
                            "another link came up during this handshake; the dialer tries again", peer=site
                        )
                    return self._owner.link_up(
                        hello.site, conn, self.shaped(hello.site, transport), ours, dict(hello.info)
                    )
        return None

    # -- dialing ------------------------------------------------------------------------------------

    async def _dial_loop(self, peer: str) -> None:
        cfg = self.cfg
        url = parse_url(cfg.peers[peer]).url
        delay = cfg.reconnect_initial_s
        failures = 0
        while not self._stop.is_set():
            link = await self._dial(peer, url, quiet=failures > 0)
            if link is None:
                failures += 1
                if not await self._pause(delay):
                    return
                delay = min(delay * cfg.reconnect_factor, cfg.reconnect_max_s)
                continue
            failures, delay = 0, cfg.reconnect_initial_s
            await self._serve(link)
            if not await self._pause(delay):
                return

    async def _pause(self, seconds: float) -> bool:
        """The backoff before the next attempt, cut short by shutdown; False if stopping."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stop.wait()
        return not self._stop.is_set()

    async def _dial(self, peer: str, url: str, *, quiet: bool) -> PeerLink | None:
        cfg = self.cfg
        try:
            transport = await connect(url, tls=cfg.tls, timeouts=cfg.timeouts)
        except (TransportError, WanrtTimeout, OSError) as exc:
            (log.debug if quiet else log.info)("cannot reach gateway %s at %s: %s", peer, url, exc)
            return None
        conn = self._connection("client", peer, peer)

        def failed(f: HandshakeFailure) -> None:
            if f.kind == "timeout":
                log.warning("gateway %s at %s: handshake not finished in time", peer, url)
            elif f.kind == "refused":
                self._owner.rejected(f"{peer} ({url})", str(f), peer, kind="auth" if f.auth else "config")
            else:
                (log.debug if quiet else log.info)("gateway %s at %s: handshake failed: %s", peer, url, f)

        async with (
            handshake_boundary(conn, transport, grace=cfg.timeouts.close, on_failure=failed),
            asyncio.timeout(cfg.timeouts.handshake),
            self._owner.handshake_gate(),
        ):
            if self._stop.is_set():
                raise TransportError("shutting down", peer=peer)
            ours = self._owner.link_info(peer)
            await transport.send([conn.hello(ours)])
            welcome = await next_event(conn, transport)
            _expect_welcome(welcome, peer, url)
            assert isinstance(welcome, Welcome)
            await transport.send([conn.authenticate()])
            return self._owner.link_up(peer, conn, self.shaped(peer, transport), ours, dict(welcome.info))
        return None

    # -- serving ------------------------------------------------------------------------------------

    async def _serve(self, link: PeerLink) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._serving.add(task)
        try:
            reason = await link.run()
        finally:
            self._serving.discard(task)
        log.debug("link to %s ended: %s", link.peer, reason)
        self._owner.link_down(link)

    def serving(self) -> list[asyncio.Task[Any]]:
        """Tasks serving a link right now (an abrupt stop cancels them)."""
        return list(self._serving)


class _Slot:
    """One handshake in progress before authentication; ``evict`` ends it at once (its deadline fires)."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.evicted = False
        self.deadline: asyncio.Timeout | None = None

    def evict(self) -> None:
        self.evicted = True
        if self.deadline is not None:
            with contextlib.suppress(RuntimeError):  # its handshake is ending already
                self.deadline.reschedule(asyncio.get_running_loop().time())


def _host_of(peer: str) -> str:
    """The remote host of a transport's peer label (``tcp://h:p`` / ``h:p``); unix peers share one."""
    text = peer.split("://", 1)[-1]
    if text.startswith("["):
        return text.split("]", 1)[0] + "]"
    return text.rsplit(":", 1)[0] if text.count(":") == 1 else text.split("#", 1)[0]


def _expect_auth(event: object, peer: str) -> None:
    if isinstance(event, Auth):
        return
    if isinstance(event, Error):
        raise RemoteProtocolError(f"gateway {peer} aborted the handshake: {event.message}", peer=peer)
    raise TransportError(f"gateway {peer} left before authenticating", peer=peer)


def _expect_welcome(event: object, peer: str, url: str) -> None:
    if isinstance(event, Welcome):
        if event.site != peer or event.role is not Role.GATEWAY:
            raise AuthError(
                f"the gateway at {url} is {event.role} {event.site!r}, not gateway {peer!r}", peer=peer
            )
        return
    if isinstance(event, Reject):
        raise RemoteProtocolError(f"gateway {peer} refused this gateway: {event.reason}", peer=peer)
    if isinstance(event, Error):
        raise RemoteProtocolError(f"gateway {peer} aborted the handshake: {event.message}", peer=peer)
    raise TransportError(f"gateway {peer} closed the connection during the handshake", peer=peer)
