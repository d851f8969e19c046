"""Where a parameter resync's messages go: :class:`~gateways.node.resync.ParamResync` decides what to ask,
answer and check; :class:`ResyncRoutes` hands it the current trainer session, the peers that may be asked
(live members with a link, the plan's parent first) and what the node knows of the job, and delivers what
it returns to a peer's link or to this site's trainer. Kept apart from the node so that the node hands every
resync frame over in one call and the resync needs no link of its own.
"""

from __future__ import annotations

from typing import Protocol

from gateways.config import GatewayConfig
from gateways.node.peer_channel import PeerChannel
from gateways.node.peer_mesh import PeerMesh
from gateways.node.resync import ParamResync, ToPeer, ToSiteTrainer
from gateways.node.trainer_side import TrainerSide
from gateways.rounds.engine import RoundEngine
from wanrt.protocol import ParamAnnounce, ParamChunk, ParamRefuse, ParamRequest

__all__ = ["ResyncHost", "ResyncRoutes"]

ParamMsg = ParamRequest | ParamAnnounce | ParamChunk | ParamRefuse


class ResyncHost(Protocol):
    """What the routes read of the node: its round engine (members, plan, frontier)."""

    @property
    def engine(self) -> RoundEngine | None: ...


class ResyncRoutes:
    """See the module docstring."""

    def __init__(
        self,
        cfg: GatewayConfig,
        host: ResyncHost,
        resync: ParamResync,
        peers: PeerMesh,
        trainer: TrainerSide,
    ) -> None:
        self.cfg = cfg
        self.site = cfg.site
        self.resync = resync
        self._host = host
        self._peers = peers
        self._trainer = trainer

    def start(self, iteration: int) -> None:
        """This site missed rounds: fetch the job's parameters of ``iteration`` from a peer."""
        self.send(self.resync.start(iteration))

    def from_trainer(self, session: int, msg: ParamMsg, n_layers: int | None, now: float) -> None:
        """A resync message of the current trainer: its own question, or its answer to a peer's."""
        if session != self._trainer.session:
            return
        self.send(self.resync.from_trainer(msg, n_layers, self.candidates(), now))

    def from_peer(self, ch: PeerChannel, msg: ParamMsg, now: float) -> None:
        engine = self._host.engine
        out = self.resync.from_peer(
            ch.peer,
            msg,
            member=engine is not None and ch.peer in engine.live,
            frontier=-1 if engine is None else engine.frontier,
            claim_margin=4 * self.cfg.rounds.window + 2,  # as far as a join may be claimed (peer_admission)
            trainer_up=self._trainer.session is not None and self.resync.need is None,
            candidates=self.candidates(),
            now=now,
        )
        self.send(out)

    def retry(self, now: float) -> None:
        self.send(self.resync.retry(self.candidates(), now))

    def link_ended(self, peer: str, now: float) -> None:
        self.send(self.resync.link_ended(peer, self.candidates(), now))

    def candidates(self) -> list[str]:
        """Peers that may be asked for the parameters: live members with a link, the plan's parent first."""
        engine = self._host.engine
        if engine is None or self.resync.need is None:
            return []
        by_peer = self._peers.by_peer
        linked = [p for p in sorted(engine.live) if p != self.site and p in by_peer]
        parent = engine.plan_for(self.resync.need).parent_of(self.site)
        if parent in linked:
            linked.remove(parent)
            linked.insert(0, parent)
        return linked

    def send(self, outs: list[ToPeer | ToSiteTrainer]) -> None:
        for o in outs:
            if isinstance(o, ToSiteTrainer):
                self._trainer.send(o.msg)
                continue
            ch = self._peers.by_peer.get(o.peer)
            if ch is None or ch.ended:
                continue
            if o.bulk is not None:
                ch.send_bulk(o.msg, o.bulk)
            else:
                ch.send_control(o.msg)
