"""Which peer gateway may link, what this site tells it in the handshake, and from which iteration a gateway
that has not joined yet takes part (the join rules of :mod:`gateways.membership.joining`, applied).

:class:`PeerAdmission` reads the node's round engine through :class:`AdmissionHost` and decides from the
two handshakes' ``info`` maps alone, so a refused link is refused before it changes anything: the node
brings a link up (:meth:`GatewayNode.link_up`) only after :meth:`PeerAdmission.admit` accepted it.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

from gateways.config import GatewayConfig
from gateways.membership.job_model import JobModelState, ModelSignature
from gateways.membership.joining import LinkInfo, join_iteration, rounds_digest
from gateways.rounds.engine import RoundEngine
from wanrt.errors import RemoteProtocolError
from wanrt.protocol import Hello, Role

__all__ = ["AdmissionHost", "PeerAdmission"]


class AdmissionHost(Protocol):
    """What admission reads of the node."""

    @property
    def engine(self) -> RoundEngine | None: ...

    @property
    def join_at(self) -> int | None: ...

    @property
    def resume_frontier(self) -> int: ...


class PeerAdmission:
    """See the module docstring. ``contacted`` is the mesh's set of peers that linked at least once."""

    def __init__(
        self, cfg: GatewayConfig, host: AdmissionHost, model: JobModelState, contacted: set[str]
    ) -> None:
        self.cfg = cfg
        self.site = cfg.site
        self._host = host
        self._model = model
        self._contacted = contacted
        self.rounds_digest = rounds_digest(cfg.rounds)
        #: until when a fresh gateway refuses to join the job from a peer that is fresh too while either
        #: of them resumes (a state file): a running peer should place them (see _fresh_pair_problem)
        self.fresh_wait_until = math.inf

    def started(self, now: float) -> None:
        t = self.cfg.timeouts
        self.fresh_wait_until = now + t.heartbeat_interval * t.heartbeat_misses

    def dialer_problem(self, hello: Hello) -> str | None:
        """Why a connecting gateway is refused (``None``: accept)."""
        if hello.role is not Role.GATEWAY:
            return f"this is the gateway listener of site {self.site!r}; role {hello.role} connects elsewhere"
        if hello.site not in self.cfg.peers:
            return f"site {hello.site!r} is not a peer of site {self.site!r} in this job"
        if not hello.site < self.site:
            return f"site {hello.site!r} must accept the connection: the smaller site name dials"
        return None

    def link_info(self, peer: str) -> dict[str, Any]:
        """Our handshake ``info`` for ``peer`` (the join rule uses what was sent: keep it)."""
        engine = self._host.engine
        join_at = self._host.join_at if engine is not None and peer not in self._contacted else None
        info = LinkInfo(
            frontier=self._host.resume_frontier if engine is None else engine.frontier,
            fresh=engine is None,
            join_at=join_at,
            live=None if engine is None else tuple(engine.live),
            low=None if engine is None else engine.oldest_unfinished(),
            joins=() if engine is None else tuple(engine.pending_joins().items()),
        ).to_info()
        info["rounds"] = self.rounds_digest
        info.update(self._model.info())
        return info

    def admit(
        self, peer: str, ours: dict[str, Any], theirs: dict[str, Any], now: float
    ) -> tuple[LinkInfo, LinkInfo, ModelSignature | None]:
        """Both ends' membership info and the peer's model, if the link may come up; RemoteProtocolError
        (saying why) if not."""
        if theirs.get("rounds") != self.rounds_digest:
            raise RemoteProtocolError(
                f"site {peer} runs different [gateway.rounds] settings; every site must use the same",
                peer=peer,
            )
        mine, other = LinkInfo.parse(ours, peer=self.site), LinkInfo.parse(theirs, peer=peer)
        self._check_claims(peer, other)
        problem = self._fresh_pair_problem(mine, other, now)
        if problem is not None:
            raise RemoteProtocolError(problem, peer=peer)
        return mine, other, ModelSignature.from_info(theirs, site=None, peer=peer)

    def _check_claims(self, peer: str, other: LinkInfo) -> None:
        """A running gateway bounds what a peer's handshake may claim by what *this* site knows, never by
        the claim itself (DESIGN.md "Trust": a peer holding its own valid keys still sends only what its
        place allows). The join rule puts a joiner at max(frontiers) + 1 + a window margin, or at its
        announced ``join_at``: a claimed frontier or ``join_at`` far past this site's frontier would put a
        site that is in no plan into the rounds of iteration 10⁶ and make every trainer here answer its
        parameter request (security probe: frontier 999 987, ``join_at`` 10⁶ was accepted).

        An honest peer is at most a few windows past this frontier while this site's live members can
        finish rounds (every finished round had a quorum that overlaps them). Only a site that is cut off
        (:meth:`RoundEngine.may_be_behind`) believes a peer far ahead: the job went on without it. A peer
        *behind* this site is not bounded: a gateway that fell behind (restarted with an older state
        file, or cut off) must still be able to link to sites far ahead of it."""
        engine = self._host.engine
        if engine is None:
            return
        w = self.cfg.rounds.window
        slack = 4 * w + 1
        known = engine.frontier
        if other.frontier > known + slack and not engine.may_be_behind():
            raise RemoteProtocolError(
                f"site {peer} claims frontier {other.frontier}, but this site is at iteration {known} and "
                f"the job cannot have gone further than {known + slack} without it; restart that gateway",
                peer=peer,
                value=other.frontier,
            )
        if other.join_at is None:
            return
        limit = max(known, other.frontier) + slack
        if other.join_at > limit:
            raise RemoteProtocolError(
                f"site {peer} claims join_at {other.join_at} at frontier {other.frontier}, but this site is "
                f"at iteration {known} (at most {limit} is believed); restart its gateway",
                peer=peer,
                value=other.join_at,
            )

    def _fresh_pair_problem(self, mine: LinkInfo, other: LinkInfo, now: float) -> str | None:
        """Why two fresh gateways must not start the job between themselves yet (None: they may).

        Two gateways restarted together (chaos soak, kill2) reach each other first, and would join "the
        job" among themselves at their state files' frontier + a window, behind the survivors, who are
        many iterations further: their trainers then wait for rounds the others finished long ago. A
        restarted gateway takes its place from a running peer instead. Only when no running peer links
        within the time a silent peer is declared lost (the whole job restarted) do fresh ones start
        it together. A cold start (no state file: frontier -1 at both ends) is never held up."""
        if self._host.engine is not None or not (mine.fresh and other.fresh):
            return None
        if self.cfg.resume_at is not None:
            return None  # the whole job resumes from its trainers' checkpoint: every gateway starts there
        if max(mine.frontier, other.frontier) < 0 or now >= self.fresh_wait_until:
            return None
        return (
            "both gateways restarted; waiting for a running gateway of the job to take this gateway's "
            f"place from (at most {self.fresh_wait_until - now:.1f} s more)"
        )

    def join_start(self, mine: LinkInfo, other: LinkInfo) -> int:
        """The iteration from which *this* site takes part, joining through a link to a peer that said
        ``other``: as the peer computes it (``join_iteration`` with the roles swapped). The peer's own
        join_at says where the peer joined, not where a gateway starting now may, and adopting it put
        restarted gateways behind the job."""
        start = join_iteration(other, mine, margin=self.cfg.rounds.window)
        if not other.fresh and other.low is not None and other.live is not None and self.site in other.live:
            # the peer never lost this site (it started with every configured site live, or has not yet
            # noticed a crash): it counts this site in every round it has open and will not call
            # peer_joined, so J computed as for a rejoin would leave those rounds waiting for a site that
            # starts past them (a late-starting gateway stalled a 4-site tree until the round deadline)
            start = max(0, min(start, other.low))
        return start
