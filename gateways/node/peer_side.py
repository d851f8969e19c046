"""The peer gateways as the node sees them: a link coming up, the frames a peer sends, a link ending.

:class:`PeerSide` reads every frame a peer sends (round data, acks, the job's model, site faults, resync
messages, Bye and errors), brings links up once :class:`~gateways.node.peer_admission.PeerAdmission`
accepted them, and ends them (a protocol violation, a silent peer, a replaced link). What that changes for
the job is decided by the node through :class:`PeerHost`: where a joining gateway starts, what a round
message does, that a peer is lost. The links' mechanics (channels, wakes, heartbeats, backlogs) are
:class:`~gateways.node.peer_mesh.PeerMesh`'s.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from gateways.config import GatewayConfig
from gateways.membership.job_model import JobModelState, ModelSignature
from gateways.membership.joining import LinkInfo
from gateways.node.actions import CloseLink, NodeAction
from gateways.node.model_agreement import ModelAgreement
from gateways.node.peer_admission import PeerAdmission
from gateways.node.peer_channel import PeerChannel
from gateways.node.peer_mesh import MAX_BACKLOG, PeerMesh
from gateways.node.probe_link import on_probe_message
from gateways.node.resync_routes import ResyncRoutes
from gateways.rounds.engine import RoundEngine
from gateways.sending.rate_allocator import RateAllocator
from gateways.stats import GatewayStats
from wanrt.errors import AuthError, ProtocolError, RemoteProtocolError, WanrtError
from wanrt.protocol import (
    Ack,
    Aggregate,
    Bye,
    Connection,
    ConnectionClosed,
    Error,
    Heartbeat,
    Message,
    ParamAnnounce,
    ParamChunk,
    ParamRefuse,
    ParamRequest,
    Push,
)
from wanrt.protocol.peer.probe_train import ProbeRequest, ProbeTrain
from wanrt.protocol.peer.round_frames import JobModel, RoundData, RoundTag
from wanrt.protocol.peer.round_msg import RoundMsg
from wanrt.protocol.peer.site_fault import SiteFault

__all__ = ["PeerHost", "PeerSide"]

log = logging.getLogger("gateways.node")


class PeerHost(Protocol):
    """The node's decisions the peer side asks for."""

    @property
    def engine(self) -> RoundEngine | None: ...

    @property
    def state(self) -> str: ...

    def peer_linked(self, peer: str, mine: LinkInfo, other: LinkInfo, now: float) -> None:
        """A link to ``peer`` came up: join the job through it, or let the peer (re)join."""

    def peer_round(self, ch: PeerChannel, tag: RoundTag, msg: RoundMsg, now: float) -> None:
        """A round message from ``ch``'s peer."""

    def peer_acked(self, peer: str, seq: int | None, now: float) -> None:
        """``peer`` acknowledged our frames up to ``seq`` (None: its link ended)."""

    def declare_lost(self, peer: str, reason: str, now: float) -> None:
        """``peer`` is lost: re-plan the rounds without it."""


class PeerSide:
    """See the module docstring. ``out`` is the node's action list (shared)."""

    def __init__(
        self,
        cfg: GatewayConfig,
        host: PeerHost,
        out: list[NodeAction],
        *,
        mesh: PeerMesh,
        admission: PeerAdmission,
        agreement: ModelAgreement,
        resync: ResyncRoutes,
        model: JobModelState,
        stats: GatewayStats,
        allocator: RateAllocator,
    ) -> None:
        self.cfg = cfg
        self._host = host
        self._out = out
        self._mesh = mesh
        self._admission = admission
        self._agreement = agreement
        self._resync = resync
        self._model = model
        self._stats = stats
        self._allocator = allocator

    def link_up(
        self, peer: str, conn: Connection, ours: dict[str, Any], theirs: dict[str, Any], now: float
    ) -> int:
        """An authenticated link to ``peer``: returns its id. Raises RemoteProtocolError to refuse it."""
        mesh, host = self._mesh, self._host
        mine, other, sig = self._admission.admit(peer, ours, theirs, now)
        # the first link to a peer starting cold (fresh, no state: frontier -1) that this site counts in
        # already (it started with every configured site live) may end before the peer brought it up too —
        # it refused the handshake after our Auth because it joined through another link meanwhile: such a
        # link is undone as if it never came up (end_link). Any other link that ends makes the peer lost,
        # as before: a peer that linked before, or resumes from a state file, was restarted, and its join
        # iteration must be negotiated again (kept live, two gateways restarted together wedged full seed 1)
        engine = host.engine
        first_contact = (
            other.fresh
            and other.frontier < 0
            and peer not in mesh.contacted
            and engine is not None
            and peer in engine.live
        )
        old = mesh.by_peer.get(peer)
        if old is not None:
            self.end_link(old, "replaced by a new connection from the same peer", now, abort=True)
        rates = self._allocator.rates()
        if peer not in rates:  # links = "plan": a neighbour's link state is made when it first links
            self._allocator.add_link(peer, self.cfg.base_rate_bps(peer))
            rates = self._allocator.rates()
        ch = mesh.open(peer, conn, rates[peer], now, confirmed=not first_contact)
        self._stats.peer_state(peer, "up", now)
        log.info("link to gateway %s up", peer)
        if sig is not None:
            self._agreement.offer(sig, theirs.get("model_established") is True, source=ch)
        elif self._model.current is not None:
            ch.send_control(JobModel(self._model.info()))
        host.peer_linked(peer, mine, other, now)
        for msg in mesh.backlog.pop(peer, []):
            ch.send_round(msg)
        self._resync.retry(now)
        self._receive(ch, ch.events(), now)  # bytes that arrived with the handshake
        return ch.link_id

    def link_data(self, link_id: int, data: bytes, now: float) -> None:
        """Bytes received on link ``link_id``."""
        ch = self._mesh.channel(link_id)
        if ch is None or ch.ended:
            return
        self._mesh.received(ch, now)
        try:
            self._receive(ch, ch.receive(data, now), now)
        except (ProtocolError, AuthError) as exc:
            self.end_link(ch, f"protocol violation by the peer: {exc}", now, error=exc)

    def link_closed(self, link_id: int, reason: str, now: float) -> None:
        """The driver saw link ``link_id`` end (the peer went away, the transport failed)."""
        ch = self._mesh.channel(link_id)
        if ch is not None:
            self.end_link(ch, reason, now, notify=False, by_peer=True)
        self._mesh.forget(link_id)

    def _receive(self, ch: PeerChannel, events: Any, now: float) -> None:
        try:
            for event in events:
                if not self._on_peer_event(ch, event, now):
                    return
        except (ProtocolError, AuthError) as exc:
            self.end_link(ch, f"protocol violation by the peer: {exc}", now, error=exc)
            return
        ch.flush_ack()

    def _on_peer_event(self, ch: PeerChannel, event: Message | ConnectionClosed, now: float) -> bool:
        """Handle one message from a peer; False once the link ended."""
        if ch.unconfirmed is not None and not isinstance(event, (Error, ConnectionClosed)):
            ch.confirm()
        if isinstance(event, Heartbeat):
            return True
        host = self._host
        if type(event) is RoundData:
            host.peer_round(ch, event, ch.on_data(event), now)
        elif isinstance(event, RoundTag):
            msg = ch.on_tag(event)
            if msg is not None:
                host.peer_round(ch, event, msg, now)
        elif isinstance(event, (Push, Aggregate)):  # Aggregate is a Push subclass; listed for clarity
            tag, msg = ch.on_payload(event)
            host.peer_round(ch, tag, msg, now)
        elif isinstance(event, Ack):
            host.peer_acked(ch.peer, ch.acked_seq(event), now)
        elif isinstance(event, JobModel):
            sig = ModelSignature.from_info(event.info, site=None, peer=ch.peer)
            if sig is None:
                raise RemoteProtocolError("JobModel without a signature", peer=ch.peer)
            self._agreement.offer(sig, event.info.get("model_established") is True, source=ch)
        elif isinstance(event, SiteFault):
            self._agreement.site_fault(ch, event, now)
        elif isinstance(event, (ProbeRequest, ProbeTrain)):
            on_probe_message(self._mesh.probes, ch, event, now)
        elif isinstance(event, (ParamRequest, ParamAnnounce, ParamChunk, ParamRefuse)):
            self._resync.from_peer(ch, event, now)
        elif isinstance(event, Bye):
            ch.send_control(Bye("bye"))
            self.end_link(ch, f"peer closed the link: {event.reason or 'no reason given'}", now)
            return False
        elif isinstance(event, Error):
            self.end_link(ch, f"peer aborted the link: {event.message}", now, by_peer=True)
            return False
        elif isinstance(event, ConnectionClosed):
            self.end_link(ch, f"connection closed ({event.reason})", now, by_peer=True)
            return False
        else:
            raise RemoteProtocolError(f"{type(event).__name__} is not used between gateways", peer=ch.peer)
        return not ch.ended

    def rejected(
        self, who: str, why: str, site: str | None, now: float | None, *, kind: str, t0: float
    ) -> None:
        """A connection was refused (wrong secret, other round settings, a race, a flood): counted, logged,
        and, when the peer site is known, shown as its ``reason`` in /status and told to this site's trainer
        as a warning (``kind`` "auth" or "config"; at ``t0``, the node's start, when no time is given)."""
        self._stats.rejected_connections += 1
        log.warning("connection from %s rejected: %s", who, why)
        st = self._stats.peers.get(site) if site is not None else None
        if site is not None and st is not None and st.state != "up":
            st.reason = f"refused: {why}"
            if now is not None:
                st.since = now
            warning = f"the link to site {site}'s gateway was refused: {why}"
            self._agreement.warn_trainer(site, kind, warning, t0 if now is None else now)

    def end_link(
        self,
        ch: PeerChannel,
        reason: str,
        now: float,
        *,
        error: WanrtError | None = None,
        abort: bool = False,
        notify: bool = True,
        by_peer: bool = False,
    ) -> None:
        """Link ``ch`` is over: tell the driver how to close it, and re-plan without it if it counted.

        The first link to a fresh peer that this site counts in already (see :meth:`link_up`), closed by
        the peer (``by_peer``: its Error, the connection ending) before it sent anything on it, does not
        make the peer lost: the peer may never have brought it up. The dialer brings its end
        up once its Auth is out, and the acceptor may still refuse the connection afterwards (another link
        came up during its handshake, the pre-join ``link_epoch`` rule). Declaring the peer lost then
        re-planned this site's open rounds alone — no other site saw a change, the partials they had sent
        here under the old plan were never sent again, and the job waited for the round deadline
        (bench_gateway's start-up stall, 1 run in 25). The peer is treated as a member that has not linked
        yet instead: what went out on the link waits for the next one, and the no-link timeout, the same
        at every site, declares it lost if none comes."""
        if ch.ended:
            return
        current = self._mesh.detach(ch)  # the queue re-plans what was queued (the engine keeps its data)
        if notify:
            self._out.append(CloseLink(ch.link_id, reason, error=error, abort=abort))
        if not current:
            return  # an older link replaced by a newer one: nothing else to account for
        peer = ch.peer
        host = self._host
        host.peer_acked(peer, None, now)
        self._resync.link_ended(peer, now)
        if host.state in ("stopping", "stopped"):
            self._stats.peer_state(peer, "down", now, reason)
            log.info("link to %s closed: %s", peer, reason)
            return
        engine = host.engine
        if engine is not None and peer in engine.live:
            unsent = ch.unconfirmed if by_peer else None
            if unsent is not None and self._never_linked(peer, unsent, reason, now):
                return
            host.declare_lost(peer, reason, now)
        else:
            self._stats.peer_state(peer, "down", now, reason)
            log.warning("link to %s down: %s", peer, reason)

    def _never_linked(self, peer: str, unsent: list[RoundMsg], reason: str, now: float) -> bool:
        """Undo a link the peer never said anything on (see :meth:`end_link`): its round messages wait
        for the next link, the no-link timeout runs again. False (declare it lost) past MAX_BACKLOG."""
        mesh = self._mesh
        backlog = unsent + mesh.backlog.get(peer, [])
        if len(backlog) > MAX_BACKLOG:
            return False
        mesh.backlog[peer] = backlog
        lost_after = mesh.lost_after
        mesh.no_link_deadline.setdefault(peer, now + lost_after)
        self._stats.peer_state(peer, "down", now, reason)
        log.warning(
            "link to %s ended before the peer sent anything on it (%s): it may never have brought the link "
            "up, so it is not declared lost; %d round messages wait for the next link (lost if none "
            "within %g s)",
            peer,
            reason,
            len(backlog),
            lost_after,
        )
        return True
