"""The links of one gateway to its peer gateways, as mechanics: which links exist, which have bytes to
write, when the next heartbeat or silence check is due, what waits for a peer without a link.

:class:`PeerMesh` holds one :class:`~gateways.node.peer_channel.PeerChannel` per link and decides nothing
about the job: who may link and from which iteration (:mod:`gateways.node.peer_admission`), what a peer's
message means and what a link that ends changes (the :class:`~gateways.node.node.GatewayNode`) are decided
elsewhere. Kept apart so that the node reads as the job's decisions, and so that the bookkeeping that
makes ``pop_actions`` and ``next_deadline`` cheap with 1 000 links (the sims' site counts) is in one place.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Final

from gateways.config import GatewayConfig
from gateways.node.actions import Wake
from gateways.node.peer_channel import PeerChannel, SendOut
from gateways.sending.edf_queue import SendQueue
from gateways.sending.link_times import LinkTimes
from gateways.sending.pacer import Pacer
from gateways.sending.probe_trains import ProbeTrains
from gateways.sending.rx_dispersion import RxDispersion
from gateways.stats import GatewayStats
from wanrt.errors import WanrtTimeout
from wanrt.protocol import Connection, Message
from wanrt.protocol.peer.round_msg import RoundMsg

__all__ = ["MAX_BACKLOG", "PeerMesh"]

#: Round messages kept for a live peer whose link is not up yet (start-up, reconnect in progress). A peer
#: that stays away this long is declared lost and the round engine re-plans without it.
MAX_BACKLOG: Final = 4096


class PeerMesh:
    """See the module docstring. ``queue``, ``link_times`` and ``stats`` are the node's, shared."""

    def __init__(
        self, cfg: GatewayConfig, *, queue: SendQueue, link_times: LinkTimes, stats: GatewayStats
    ) -> None:
        self.cfg = cfg
        self.queue = queue
        self.link_times = link_times
        self.stats = stats
        #: per peer, the peer → us link's tail-dispersion samples (gateways/sending/rx_dispersion.py)
        self.rx_rates: dict[str, RxDispersion] = {}
        self.probes = ProbeTrains(cfg.delivery)  # timed probe trains (gateways/node/probe_link.py)
        self.channels: dict[int, PeerChannel] = {}
        #: channels that may have bytes to write: each queued frame adds its channel (PeerChannel.outbox),
        #: wakes() keeps the ones still pending; every other channel has nothing to write
        self._maybe_pending: dict[int, PeerChannel] = {}
        #: two links to one peer share its EDF queue, so a frame queued through one makes both pending:
        #: from the first such link on, wakes() looks at every link again (rare: a reconnect race)
        self._scan_all_links = False
        #: min over live channels of PeerChannel.due (None: recompute); both times only move forward, so
        #: a receive changes the min only when it moves the very channel holding it
        self._links_due: float | None = None
        self.by_peer: dict[str, PeerChannel] = {}
        self._link_ids = itertools.count(1)
        self._item_ids = itertools.count(1)
        #: round messages for a live peer whose link is not up yet (MAX_BACKLOG bounds it)
        self.backlog: dict[str, list[RoundMsg]] = {}
        #: peers that linked at least once
        self.contacted: set[str] = set()
        #: members expected to link, and by when (else they are declared lost)
        self.no_link_deadline: dict[str, float] = {}

    @property
    def lost_after(self) -> float:
        """How long a peer may stay silent (or unlinked) before it is declared lost."""
        t = self.cfg.timeouts
        return t.heartbeat_interval * t.heartbeat_misses

    # -- what the driver asks ------------------------------------------------------------------------

    def wakes(self) -> list[Wake]:
        """A :class:`Wake` for every link with bytes to write."""
        out: list[Wake] = []
        maybe = self._maybe_pending
        if self._scan_all_links:
            for ch in self.channels.values():
                if not ch.ended and ch.pending():
                    out.append(Wake(ch.link_id))
        elif maybe:
            channels = self.channels
            # in link-id order: the order of self.channels, which the driver's writes follow; the dict
            # is shared with the channels (PeerChannel.outbox), so it is trimmed in place
            for link_id in sorted(maybe) if len(maybe) > 1 else list(maybe):
                ch = maybe[link_id]
                if channels.get(link_id) is ch and not ch.ended and ch.pending():
                    out.append(Wake(link_id))
                else:
                    del maybe[link_id]
        return out

    def next_due(self) -> float | None:
        """The earliest heartbeat, silence check or no-link deadline."""
        best = self._links_due
        if best is None and self.channels:
            lost_after = self.lost_after
            for ch in self.channels.values():
                if not ch.ended:
                    d = ch.due(lost_after)
                    if best is None or d < best:
                        best = d
            self._links_due = best
        for d in self.no_link_deadline.values():
            if best is None or d < best:
                best = d
        return best

    def beat(self, now: float, silent: Callable[[PeerChannel, WanrtTimeout], None]) -> None:
        """Heartbeats that are due; ``silent`` ends each link whose peer said nothing for too long (in link
        order, between the beats: what ending one queues on another goes before that one's beat)."""
        t = self.cfg.timeouts
        lost_after = self.lost_after
        for ch in list(self.channels.values()):
            if ch.ended:
                continue
            quiet = now - ch.last_rx
            if quiet > lost_after:
                exc = WanrtTimeout(
                    f"no heartbeat from {ch.peer} for {quiet:.1f} s",
                    phase="heartbeat",
                    seconds=lost_after,
                    peer=ch.peer,
                )
                silent(ch, exc)
                continue
            if now >= ch.next_beat:
                ch.heartbeat(now)
                ch.next_beat = now + t.heartbeat_interval
        self._links_due = None  # the beats above moved it

    def unlinked_past(self, now: float) -> list[str]:
        """Members whose no-link deadline passed (forgotten here; the node decides what follows)."""
        out = [peer for peer, at in self.no_link_deadline.items() if at <= now]
        for peer in out:
            del self.no_link_deadline[peer]
        return out

    def poll(self, link_id: int, now: float) -> SendOut:
        """What link ``link_id``'s writer does next (see :class:`~gateways.node.peer_channel.SendOut`)."""
        ch = self.channels.get(link_id)
        if ch is None:
            return SendOut(done=True)
        out = ch.poll(now)
        self._maybe_pending[link_id] = ch  # a frame the pacer held back is still pending
        if out.done or (ch.ended and not out.parts):
            out.done = True
        return out

    # -- links ---------------------------------------------------------------------------------------

    def open(self, peer: str, conn: Connection, rate: float, now: float, *, confirmed: bool) -> PeerChannel:
        """A link to ``peer`` came up (the node already ended any earlier one): its channel, which says hello
        with a heartbeat at once (the first frame from us is what tells the peer this end is up)."""
        ch = PeerChannel(
            next(self._link_ids),
            peer,
            conn,
            queue=self.queue,
            item_ids=self._item_ids,
            pacer=Pacer(rate, now, self.cfg.pacer_burst_s),
            link_times=self.link_times,
            counters=self.stats.peer(peer).counters,
            now=now,
            rx=self.rx_rates.setdefault(peer, RxDispersion(self.cfg.delivery)),
        )
        ch.outbox = self._maybe_pending
        ch.heartbeat(now)
        ch.next_beat = now + self.cfg.timeouts.heartbeat_interval
        if confirmed:
            ch.confirm()  # this link joins a member: its end is accounted for as before
        if peer in self.by_peer or self.queue.pending(peer):
            self._scan_all_links = True
        self.channels[ch.link_id] = ch
        self._links_due = None
        self.by_peer[peer] = ch
        self.contacted.add(peer)
        self.no_link_deadline.pop(peer, None)
        return ch

    def received(self, ch: PeerChannel, now: float) -> None:
        """Bytes are about to be received on ``ch``: keep the cached earliest due time right."""
        links_due = self._links_due
        if links_due is None:
            return
        lost_after = self.lost_after
        before = ch.due(lost_after)
        ch.last_rx = now  # what ch.receive sets first
        after = ch.due(lost_after)
        if after < links_due:
            self._links_due = after
        elif after != before and before <= links_due:
            self._links_due = None  # it held the min and moved: recompute on demand

    def detach(self, ch: PeerChannel) -> bool:
        """``ch`` ended. True if it was the peer's current link (its queued frames are dropped: the round
        engine re-plans them from its own data); False for an older link a newer one replaced."""
        ch.ended = True
        self._links_due = None
        peer = ch.peer
        if self.by_peer.get(peer) is not ch:
            return False
        del self.by_peer[peer]
        self.queue.cancel_peer(peer)
        self.link_times.drop_peer(peer)
        return True

    def forget(self, link_id: int) -> PeerChannel | None:
        """The driver closed link ``link_id``: its channel is dropped (returned if it was known)."""
        return self.channels.pop(link_id, None)

    def channel(self, link_id: int) -> PeerChannel | None:
        return self.channels.get(link_id)

    def link_id_of(self, peer: str) -> int | None:
        ch = self.by_peer.get(peer)
        return None if ch is None or ch.ended else ch.link_id

    def expect(self, peer: str, at: float) -> None:
        """``peer`` is a member that has not linked: it is lost unless it links by ``at``."""
        self.no_link_deadline[peer] = at

    # -- sending -------------------------------------------------------------------------------------

    def broadcast(self, msg: Message, *, skip: PeerChannel | None = None) -> None:
        """A control message to every peer's current link (but ``skip``)."""
        for ch in self.by_peer.values():
            if ch is not skip:
                ch.send_control(msg)

    def writable(self, peer: str) -> PeerChannel | None:
        """``peer``'s current link if round messages may still go on it (up, our Bye not sent)."""
        ch = self.by_peer.get(peer)
        return ch if ch is not None and not ch.ended and not ch.bye_sent else None

    def hold(self, peer: str, msg: RoundMsg) -> int:
        """Keep ``msg`` for ``peer``'s next link; returns how many wait."""
        backlog = self.backlog.setdefault(peer, [])
        backlog.append(msg)
        return len(backlog)
