"""Which trainer run may train at this site, and what the Welcome tells a trainer before it authenticates.

A run is one ``wanrt.init`` (an id in the Hello): :mod:`gateways.node.trainer_runs` decides between a
reconnect of the run served, the first run, the restart of a run whose trainer died (it starts at the
site's next iteration and fetches the job's parameters), a checkpoint resumed where this site stopped, and
another run (refused, saying what to do); :mod:`gateways.node.trainer_restart` lets in the process the
scheduler restarted. :class:`TrainerAdmission` applies those verdicts twice: in the Welcome's ``info``
(so the client raises at ``wanrt.init`` with one clear message) and after the handshake (the decision that
counts, which may start a resync). Kept apart from :class:`~gateways.node.trainer_side.TrainerSide`, as
:mod:`gateways.node.peer_admission` is from the peer side: admission decides who is served, the side serves.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from gateways.config import GatewayConfig
from gateways.membership.job_model import JobModelState
from gateways.membership.trainer_ledger import TrainerLedger
from gateways.node.resync import ParamResync
from gateways.node.trainer_restart import TrainerRestart
from gateways.node.trainer_runs import RunVerdict, TrainerRuns, resume_at_of
from gateways.node.trainer_side import TrainerSide
from gateways.rounds.engine import RoundEngine
from gateways.stats import GatewayStats
from wanrt.codec.negotiation import VALUE_CODINGS_KEY, offered_codings
from wanrt.protocol.job_settings import RESTART_FROM_KEY
from wanrt.protocol.push_pieces import PUSH_CUT_KEY, PUSH_OWN_KEY, push_cut_value

__all__ = ["RunHost", "TrainerAdmission"]

log = logging.getLogger("gateways.node")


class RunHost(Protocol):
    """What admission reads of the node, and the one thing it asks of it (a resync from ``iteration``:
    an admitted replacement fetches the job's parameters)."""

    @property
    def engine(self) -> RoundEngine | None: ...

    @property
    def ledger(self) -> TrainerLedger | None: ...

    @property
    def join_at(self) -> int | None: ...

    def start_resync(self, iteration: int) -> None: ...


class TrainerAdmission:
    """See the module docstring."""

    def __init__(
        self,
        cfg: GatewayConfig,
        host: RunHost,
        trainer: TrainerSide,
        *,
        stats: GatewayStats,
        model: JobModelState,
        runs: TrainerRuns,
        restart: TrainerRestart,
        resync: ParamResync,
    ) -> None:
        self.cfg = cfg
        self.site = cfg.site
        self._host = host
        self._trainer = trainer
        self._stats = stats
        self._model = model
        self.runs = runs
        self.restart = restart
        self.resync = resync

    def welcome_info(self, hello: dict[str, Any] | None = None) -> dict[str, Any]:
        """The Welcome's info for a trainer whose Hello said ``hello``: the job's model, where the job is,
        and, for a run this gateway will not serve, ``refused`` (why) and ``retry`` — so the client raises
        at ``wanrt.init`` with that one message (the decision is made again after the trainer
        authenticated: :meth:`run_problem`); for the restart of a dead run, ``restart_from``."""
        engine = self._host.engine
        join_at = self._host.join_at
        info = self._model.info()
        info["frontier"] = -1 if engine is None else engine.frontier
        info["join_at"] = -1 if join_at is None else join_at
        info[VALUE_CODINGS_KEY] = offered_codings()  # low-bit values this gateway decodes (issue 23)
        rc = self.cfg.rounds
        if rc.topology == "allpairs" and rc.allpairs_chunk_bytes and rc.forward_policy == "exact":
            sites = sorted({self.site, *self.cfg.peers})  # the all-pairs core, as build_plan orders it
            info[PUSH_CUT_KEY] = push_cut_value(len(sites), rc.allpairs_chunk_bytes)  # streamed pushes
            info[PUSH_OWN_KEY] = sites.index(self.site)  # its pieces last (a stale index: only the order)
        start = self.restart.start_at(self._trainer.next_push())
        if hello is not None:
            verdict = self._run_verdict(hello)
            # the process the scheduler restarted (KILL_RESTART) is let in by the order whatever the old
            # run's state (its close() said Bye: "finished"), as run_problem decides after the handshake
            ordered = start is not None and verdict.kind in ("replace", "refused")
            if verdict.problem is not None and not ordered:
                info["refused"] = verdict.problem[:900]
                info["retry"] = verdict.retry
            elif verdict.kind == "replace" and not ordered:
                start = self._trainer.replacement_start()
                self.runs.offered = start  # the empty pushes for the dead trainer stay below it
        if start is not None:  # read only by a replacement trainer's first connection
            info[RESTART_FROM_KEY] = start
        return info

    def _run_verdict(self, info: dict[str, Any]) -> RunVerdict:
        engine = self._host.engine
        frontier = -1 if engine is None else engine.frontier
        served = self._stats.trainer_pushes > 0
        return self.runs.verdict(
            info.get("run"),
            resume_at_of(info),
            None if self._host.ledger is None else self._trainer.next_push(),
            frontier,
            served=served,
            resync_pending=self.resync.need is not None,
            reconnect=info.get("reconnect") is True,
        )

    def run_problem(self, info: dict[str, Any]) -> str | None:
        """Which run may train here (gateways.node.trainer_runs): a reconnect of the run served, the first
        run, the restart of a run whose trainer died (it starts at the site's next iteration and fetches
        the job's parameters and optimizer state), a checkpoint resumed where this site stopped, or the
        process the scheduler restarted (KILL_RESTART); anything else is another run: refused, saying
        what to do (its pushes would be taken for the old run's re-sends and hang)."""
        run = info.get("run")
        verdict = self._run_verdict(info)
        start = self.restart.start_at(self._trainer.next_push())
        if verdict.kind in ("replace", "refused") and start is not None and self.restart.admit():
            # the process the scheduler restarted (KILL_RESTART): the new one takes over where the old
            # one stopped (its Welcome said so) and fetches the job's parameters
            self.runs.admit(run, RunVerdict("replace"))
            self._host.start_resync(start)
            return None
        if verdict.problem is None:
            if verdict.kind == "replace":
                start = self._trainer.replacement_start()
                log.warning(
                    "a new trainer run replaces run %s, whose trainer died (%s): it starts at iteration %d "
                    "and fetches the job's parameters and optimizer state from another site",
                    self.runs.run,
                    self.runs.gone_reason,
                    start,
                )
                ledger = self._host.ledger
                if ledger is not None:
                    ledger.forget_aggregates()  # the dead run's; the resync snapshot holds them
                self._host.start_resync(start)
            elif verdict.kind == "resume":
                log.warning(
                    "a new trainer run resumes the job from its checkpoint of iteration %d (run %s "
                    "stopped there)",
                    self.runs.stopped_at,
                    self.runs.run,
                )
            self.runs.admit(run, verdict)
            return None
        return verdict.problem
