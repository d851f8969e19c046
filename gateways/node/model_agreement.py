"""What the sites of a job agree on besides the rounds: which model is the job's, and which site faults
(a trainer with another model, a trainer that failed to authenticate or died) every site must hear of.

:class:`ModelAgreement` applies :mod:`gateways.membership.job_model` (which signature wins) and
:mod:`gateways.membership.site_faults` (which faults are news, fatal or a warning) to what peers and this
site's trainer present, and says so to the peers (``JobModel``, ``SiteFault`` frames) and the trainer
(``Notice``, or the refusal of its connection). Kept out of the node because none of it touches the
rounds: the node only routes the frames here.
"""

from __future__ import annotations

import logging
import math

from gateways.membership.job_model import JobModelState, ModelSignature
from gateways.membership.site_faults import SiteFaults
from gateways.node.actions import NodeAction, RefuseTrainer, ToTrainer
from gateways.node.peer_channel import PeerChannel
from gateways.node.peer_mesh import PeerMesh
from gateways.node.trainer_side import TrainerSide
from gateways.stats import GatewayStats
from wanrt.protocol import Notice
from wanrt.protocol.peer.round_frames import JobModel
from wanrt.protocol.peer.site_fault import SiteFault

__all__ = ["ModelAgreement"]

log = logging.getLogger("gateways.node")


class ModelAgreement:
    """See the module docstring. ``out`` is the node's action list (shared)."""

    def __init__(
        self,
        site: str,
        peers: PeerMesh,
        trainer: TrainerSide,
        model: JobModelState,
        stats: GatewayStats,
        out: list[NodeAction],
    ) -> None:
        self.site = site
        self.model = model
        self.faults = SiteFaults(site)
        #: what a trainer refused in its handshake is told first (ModelMismatch naming the layer)
        self.refusal_notice: Notice | None = None
        self._peers = peers
        self._trainer = trainer
        self._stats = stats
        self._out = out
        self._trainer_auth_told = -math.inf  # when the peers last heard of a failed trainer handshake

    # -- the job's model -----------------------------------------------------------------------------

    def offer(self, sig: ModelSignature, established: bool, *, source: PeerChannel | None) -> None:
        """A peer presented ``sig`` (in its handshake or a ``JobModel`` frame on ``source``)."""
        before = self.model.current
        outcome = self.model.offer(sig, established=established)
        cur = self.model.current
        assert cur is not None
        if outcome == "kept" and source is not None:
            log.error(
                "site %s trains a different model than the job's (presented by site %s)", sig.site, cur.site
            )
            source.send_control(JobModel(self.model.info()))
        if outcome in ("adopted", "replaced") or (before is not None and before.site != cur.site):
            if outcome == "replaced":
                log.error(
                    "the job's model is site %s's; site %s's model differs", cur.site, before and before.site
                )
            self._peers.broadcast(JobModel(self.model.info()), skip=source)
        trainer = self._trainer
        if trainer.session is not None and trainer.model is not None and not cur.same_model(trainer.model):
            log.error("this site's trainer runs a different model than the job's; closing its connection")
            problem = f"this site's model differs from the job's model (as trained by site {cur.site})"
            self._own_model_fault(trainer.model, cur)
            # the job's signature lets the trainer name the first differing layer (ModelMismatch)
            self._out.append(
                ToTrainer(trainer.session, Notice(self.site, "model", problem, True, self.model.info()))
            )
            self._out.append(RefuseTrainer(trainer.session, problem))

    def trainer_offer(self, sig: ModelSignature) -> str | None:
        """This site's trainer presented ``sig`` in its handshake: why it may not train here (None: its
        model is the job's, or becomes it)."""
        before = self.model.current
        outcome = self.model.offer(sig, established=False)
        if outcome == "kept":
            cur = self.model.current
            assert cur is not None
            self._own_model_fault(sig, cur)
            problem = f"this site's model differs from the job's model (as trained by site {cur.site})"
            # the job's model came after this trainer's Welcome: the notice lets it name the layer
            self.refusal_notice = Notice(self.site, "model", problem, True, self.model.info())
            return problem
        if outcome != "same" or before is None:
            self._peers.broadcast(JobModel(self.model.info()))
        self._trainer.model = sig
        return None

    # -- site faults (gateways.membership.site_faults) -----------------------------------------------

    def _own_model_fault(self, sig: ModelSignature, job: ModelSignature) -> None:
        """This site's trainer presented another model than the job's: every other site hears of it."""
        fault = SiteFault(
            self.site,
            "model",
            f"site {self.site}'s trainer runs a different model than the job's (trained by site {job.site})",
            sig.info(established=False),
        )
        if self.faults.own(fault):
            self._peers.broadcast(fault)

    def trainer_auth_failed(self, reason: str, now: float) -> None:
        """A connection to this site's trainer socket failed to authenticate: the other sites' trainers,
        which would wait for this site, hear of it as a warning (at most once per 30 s)."""
        if now - self._trainer_auth_told < 30.0:
            return
        self._trainer_auth_told = now
        fault = SiteFault(
            self.site,
            "trainer_auth",
            f"a trainer of site {self.site} failed to authenticate with its gateway ({reason[:200]}); "
            "check its secret_file",
        )
        self._peers.broadcast(fault)

    def site_fault(self, ch: PeerChannel, fault: SiteFault, now: float) -> None:
        """A peer reported a fault of site ``fault.site`` (its own, or relayed)."""
        if fault.kind in ("trainer_auth", "trainer_gone"):  # warnings, only from that site itself
            if fault.site == ch.peer:
                if fault.kind == "trainer_gone":
                    log.warning("site %s reports: %s", fault.site, fault.message)
                kind = "auth" if fault.kind == "trainer_auth" else "trainer"  # Notice kinds
                self.warn_trainer(fault.site, kind, fault.message, now)
            return
        live = {p for p, c in self._peers.by_peer.items() if not c.ended}
        # fatal while the job is starting *for that site*: this gateway has run no round yet, or none with
        # that site's contribution (the sites that started first ran rounds without it, and would wait for
        # it until their update deadline: issue 21, "one extra layer at site b" hung site a 120 s)
        starting = not self.model.established or fault.site not in self._stats.contributed
        if not self.faults.accept(fault, from_peer=ch.peer, live_peers=live, fatal=starting):
            return
        log.error("site %s reports: %s", fault.site, fault.message)
        self._peers.broadcast(fault, skip=ch)
        self._trainer.send(self.faults.notice(fault))

    def warn_trainer(self, site: str, kind: str, message: str, now: float) -> None:
        """This site's trainer hears a warning about ``site`` (repeated at most every 30 s)."""
        notice = self.faults.warn(site, kind, message, now)
        if notice is not None:
            self._trainer.send(notice)
