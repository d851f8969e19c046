"""The job's scheduler as the gateway node sees it: the two phases of its decisions, the configuration
updates they carry to this site's trainer, and the link's reports.

A decision (``Announce``, :mod:`wanrt.protocol.scheduler.messages`) is prepared at every gateway before any
commits it: a prepare is refused when its plan cannot apply here or its iteration may already be running
(so a commit is never half-applied), a commit adopts the plan from the decision's own iteration at every
gateway (STAR §IV-B) and forwards the trainer settings, effective at that iteration or, when the commit
came late, as soon as possible. Telemetry goes to the scheduler every ``telemetry_interval_s`` (rendered by
:mod:`gateways.node.reports`); shard traffic passes through :mod:`gateways.node.shard_relay`.
:class:`SchedulerSide` changes the running plan only through :meth:`SchedulerHost.set_plan`, the node's.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from gateways.config import GatewayConfig
from gateways.node.actions import NodeAction, ToScheduler
from gateways.node.plan_values import plan_problem, plan_spec
from gateways.node.shard_relay import ShardRelay
from gateways.node.trainer_restart import TrainerRestart
from gateways.node.trainer_side import TrainerSide
from gateways.rounds.engine import RoundEngine
from gateways.rounds.topology import PlanSpec
from gateways.wire.config_update import trainer_config_update
from wanrt.errors import ConfigError, RemoteProtocolError
from wanrt.live_settings import PLAN_KEYS, RESTART_KEY, split_plan_values
from wanrt.protocol import ConfigUpdate, Message
from wanrt.protocol.scheduler.messages import Announce, AnnounceReply, SiteShardGrant, site_values

__all__ = ["SchedulerHost", "SchedulerSide"]

log = logging.getLogger("gateways.node")

#: prepared decisions kept: a scheduler that never commits cannot grow them; the newest are kept
MAX_PREPARED = 16


class SchedulerHost(Protocol):
    """What the scheduler side reads of the node, and the one change it asks of it (the plan)."""

    @property
    def engine(self) -> RoundEngine | None: ...

    def set_plan(self, spec: PlanSpec, now: float, effective_iteration: int | None = None) -> None: ...


class SchedulerSide:
    """See the module docstring. ``out`` is the node's action list (shared)."""

    def __init__(
        self,
        cfg: GatewayConfig,
        host: SchedulerHost,
        out: list[NodeAction],
        *,
        trainer: TrainerSide,
        restart: TrainerRestart,
        shards: ShardRelay,
    ) -> None:
        self.cfg = cfg
        self.site = cfg.site
        self.sites = tuple(sorted({cfg.site, *cfg.peers}))
        self._host = host
        self._out = out
        self._trainer = trainer
        self._restart = restart
        self._shards = shards
        self.up = False
        self.next_report: float | None = None
        self._prepared: dict[int, Announce] = {}  # decisions announced, not committed yet (bounded)
        self.decision = 0  # the committed decision this site runs
        self.decision_late = 0  # its commit came after its iteration (applied as soon as possible)
        self.plan_spec: PlanSpec | None = None  # the last plan a committed decision set (None: config's)
        #: the trainer settings in force, for trainer sessions that connect later and the reports
        self.config_update: ConfigUpdate | None = None

    # -- the link ------------------------------------------------------------------------------------

    def connected(self, now: float) -> None:
        """The link is up: the first report goes at once (the node renders it), the next after an
        interval."""
        self.up = True
        self.next_report = now + self.cfg.telemetry_interval_s

    def disconnected(self) -> None:
        """Training goes on with the last committed decision; prepared ones are forgotten."""
        self.up = False
        self.next_report = None
        self._prepared.clear()

    def report_due(self, now: float) -> bool:
        """A report is due now (the next one is scheduled)."""
        if self.next_report is None or now < self.next_report:
            return False
        self.next_report = now + self.cfg.telemetry_interval_s
        return True

    def send(self, msgs: list[Message]) -> None:
        """``msgs`` to the scheduler if it is connected (dropped otherwise: see :class:`ToScheduler`)."""
        if self.up:
            self._out.extend(ToScheduler(m) for m in msgs)

    # -- the two phases ------------------------------------------------------------------------------

    def _safe_iteration(self) -> int:
        """The first iteration this site's trainers cannot have reached yet: they run at most ``window``
        iterations past the frontier (pushes beyond it are refused), plus one in flight."""
        engine = self._host.engine
        frontier = -1 if engine is None else engine.frontier
        return frontier + self.cfg.rounds.window + 2

    def scheduler_message(self, msg: Message, now: float) -> None:
        """An Announce or a shard grant from the scheduler (RemoteProtocolError for anything else: the link
        ends)."""
        trainer = self._trainer
        if isinstance(msg, SiteShardGrant):
            up, down = self._shards.from_scheduler(msg, trainer.session is not None)
            self.send(up)
            for m in down:
                trainer.send(m)
            return
        if not isinstance(msg, Announce):
            raise RemoteProtocolError(f"the scheduler may not send {type(msg).__name__}", peer="scheduler")
        engine = self._host.engine
        frontier = -1 if engine is None else engine.frontier
        values = site_values(msg.values, self.site)
        if msg.phase == "prepare":
            trainer_values, _ = split_plan_values(values)
            if trainer_values:
                trainer_config_update(trainer_values, msg.effective_iteration)  # shared schema (ConfigError)
            # plan settings this gateway cannot apply are refused now, so a commit is never half-applied
            problem = plan_problem(values, self.cfg.rounds, self.cfg.root, self.sites)
            problem = problem or self._restart.problem(values, trainer.metrics.get("world_size"))
            if problem is not None:
                log.warning("refusing decision %d: its plan cannot apply here: %s", msg.decision, problem)
            ok = problem is None and engine is not None and msg.effective_iteration >= self._safe_iteration()
            if ok:
                if len(self._prepared) >= MAX_PREPARED:  # a scheduler that never commits: keep the newest
                    del self._prepared[min(self._prepared)]
                self._prepared[msg.decision] = msg
            self._out.append(ToScheduler(AnnounceReply(msg.decision, ok, frontier, problem or "")))
        elif msg.phase == "abort":
            self._prepared.pop(msg.decision, None)
        else:  # commit (also the current decision re-sent to a gateway that reconnects)
            self._prepared.pop(msg.decision, None)
            if msg.decision <= self.decision:
                return  # already running it (or a newer one)
            effective = msg.effective_iteration
            safe = self._safe_iteration()
            if effective < safe and engine is not None and effective <= frontier + 1:
                log.warning(
                    "decision %d arrived after its iteration %d (frontier %d); applied from %d",
                    msg.decision,
                    effective,
                    frontier,
                    safe,
                )
                self.decision_late += 1
                effective = safe
            self.decision = msg.decision
            # the plan from the decision's own iteration even when the commit came late: rounds already
            # finished keep theirs, unfinished ones re-plan, so this gateway agrees with the others
            self._commit_plan(msg.decision, values, msg.effective_iteration, now)
            trainer_values, _ = split_plan_values(values)
            if trainer_values:
                # a restart order goes to the trainer connected now, once; later sessions get the rest
                keep = self._restart.committed(msg.decision, trainer_values, msg.effective_iteration)
                self._forward_config(trainer_values, effective, keep)

    def _commit_plan(self, decision: int, values: dict[str, Any], effective: int, now: float) -> None:
        """STAR §IV-B: the decision's plan (e.g. parent–child with its straggler sites and t_w) governs
        every round from ``effective`` on — the same spec and iteration at every gateway."""
        try:
            spec = plan_spec(values, self.cfg.rounds, self.cfg.root, self.sites)
        except ConfigError as e:  # a commit re-sent on reconnect without a prepare this gateway checked
            log.error("decision %d: its plan cannot apply here (%s); keeping the current plan", decision, e)
            return
        if spec is None or spec == self.plan_spec:
            return  # later decisions carry the plan on unchanged: nothing to re-plan
        self.plan_spec = spec
        log.info(
            "decision %d: plan %s (stragglers %s, t_w %s) from iteration %d",
            decision,
            spec.kind,
            ",".join(spec.stragglers) or "none",
            "default" if spec.t_w_s is None else f"{spec.t_w_s:g} s",
            effective,
        )
        if self._host.engine is not None:  # not joined yet: the node's _create_engine starts with it
            self._host.set_plan(spec, now, effective)

    # -- configuration updates for the trainer -------------------------------------------------------

    def apply_config(
        self, values: dict[str, Any], effective_iteration: int | None, now: float
    ) -> dict[str, Any]:
        """Forward a trainer configuration update; returns what was applied. Without an iteration it takes
        effect ahead of every site's frontier. Plan settings are refused: they must reach every gateway
        for the same iteration, which only the scheduler's two phases guarantee."""
        plan_keys = [k for k in values if k in PLAN_KEYS]
        if plan_keys:
            raise ConfigError(
                f"{plan_keys[0]}: plan settings are changed through the scheduler (the same for every site)",
                key=plan_keys[0],
            )
        if RESTART_KEY in values:
            raise ConfigError(
                f"{RESTART_KEY}: a restart is ordered by the scheduler's straggler policy only",
                key=RESTART_KEY,
            )
        if effective_iteration is None:
            engine = self._host.engine
            frontier = -1 if engine is None else engine.frontier
            effective_iteration = frontier + self.cfg.rounds.window + 1
        msg = self._forward_config(values, effective_iteration, values)
        return {
            "values": msg.values,
            "effective_iteration": msg.effective_iteration,
            "forwarded": self._trainer.session is not None,
        }

    def _forward_config(self, values: dict[str, Any], effective: int, keep: dict[str, Any]) -> ConfigUpdate:
        """``values`` to the trainer connected now; ``keep`` (the same, or without a one-shot restart
        order) for trainer sessions that connect later and the reports to the scheduler."""
        msg = trainer_config_update(values, effective)
        if keep:
            self.config_update = msg if keep == values else trainer_config_update(keep, effective)
        self._trainer.send(msg)
        return msg
