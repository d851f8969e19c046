"""What a peer gateway may hand this one for a round, by its place in the round's plan.

Reliability: a peer that holds the job secret is trusted to speak the protocol, not to send whatever it
likes. Every message is checked before it touches state (:func:`gateways.rounds.checks.check_message`:
iterations within ``max_lag`` behind and ``window`` ahead of the newest seen, layer ids, id-list bounds,
the layer's shape); a partial or an extra is taken only from a child of this site in the round's plan,
once per round; a result only from the site that may hand it one (:meth:`PeerInputs.may_finalize`). A
breach raises a :class:`~wanrt.errors.RemoteProtocolError` (the daemon closes that peer's link); what is
merely late or foreign is counted in :class:`~gateways.rounds.state.EngineStats` and ignored.

The engine routes each message and decides what follows (gather, close, hold for a re-plan); this class
checks and stores. Sans-IO.
"""

from __future__ import annotations

from gateways.rounds.aggregate import aggregate
from gateways.rounds.checks import check_message
from gateways.rounds.config import RoundConfig
from gateways.rounds.layer_formats import LayerFormats
from gateways.rounds.state import EngineStats, OpenRound, merge_ids
from wanrt.errors import LocalProtocolError, RemoteProtocolError
from wanrt.protocol.peer.round_msg import RoundMsg

__all__ = ["PeerInputs"]


class PeerInputs:
    """The admission rules for peer messages at gateway ``site`` of a job of ``sites``."""

    def __init__(
        self,
        site: str,
        sites: frozenset[str],
        config: RoundConfig,
        max_ids: int,
        formats: LayerFormats,
        stats: EngineStats,
    ) -> None:
        self.site = site
        self._sites = sites  # interned, shared by equal engines: see checks.check_message
        self._config = config
        self._max_ids = max_ids
        self._formats = formats
        self._stats = stats

    def check_peer(self, peer: str) -> None:
        if peer not in self._sites:
            raise RemoteProtocolError("unknown site", peer=peer)
        if peer == self.site:
            raise LocalProtocolError("a gateway cannot be its own peer", peer=peer)

    def validate(self, peer: str, m: RoundMsg, frontier: int, join_hint: int) -> None:
        """Bounds and shape of ``m``, with ``frontier`` the newest iteration seen here and ``join_hint``
        the newest a known join lets peers run ahead to."""
        check_message(
            peer,
            m,
            site=self.site,
            sites=self._sites,
            lowest=frontier - self._config.max_lag,
            highest=max(frontier, join_hint) + self._config.window,
            max_ids=self._max_ids,
        )
        if m.payload is not None:
            self._formats.check(m.layer, m.payload, peer)

    def may_finalize(self, peer: str, parent: str | None, r: OpenRound | None) -> bool:
        """Only this site's parent hands it a round's result (another's is ignored, counted as
        foreign_finals): the parent in the plan of that iteration (``parent``), or in the plan the open
        round was started under (a re-plan in between), the peer the round waits on, or a peer this site
        sent the round to (it answers a re-run with the result it already has)."""
        if parent == peer:
            return True
        return r is not None and (
            r.plan.parent_of(self.site) == peer or r.wait_peer == peer or peer in r.asked
        )

    def take_partial(self, peer: str, r: OpenRound, m: RoundMsg) -> bool:
        """A child's partial of ``r``; False if the round was gathered without it (it is late)."""
        if r.plan.parent_of(peer) != self.site:
            raise RemoteProtocolError(
                "partial from a site that is not our child", peer=peer, value=r.plan.plan_id
            )
        if peer in r.inputs:
            raise RemoteProtocolError("duplicate partial", peer=peer, value=(m.iteration, m.layer))
        if r.gathered:
            r.late.add(peer)
            self._stats.late_inputs += 1  # proceeded without it; its originators carry it
            return False
        r.inputs[peer] = m
        return True

    def take_extra(self, peer: str, r: OpenRound, m: RoundMsg) -> None:
        """A child's carry sent ahead into ``r`` (ignored once ``r`` is gathered: its sender carries it)."""
        if r.plan.parent_of(peer) != self.site:
            raise RemoteProtocolError(
                "extra from a site that is not our child", peer=peer, value=r.plan.plan_id
            )
        if r.gathered:
            self._stats.late_inputs += 1  # too late again: its originator carries it on
            return
        have = r.extras_in.get(peer)
        if have is None:
            r.extras_in[peer] = (m.payload, m.sites)
        else:  # several carries aimed at one round: keep one merged entry per child (bounded state)
            r.extras_in[peer] = (
                aggregate([have[0], m.payload], peers=[peer, peer]),
                merge_ids(have[1], m.sites),
            )
