"""This site's trainer as the gateway node sees it: which session is current, what goes to it, what its
pushes and measurements must say, and what it is owed.

:class:`TrainerSide` owns the trainer session's state (the current session, its streamed pushes being put
together, the model it presented, the leader's latest measurements) and the trainer's side of the rounds:
its pushes counted by :mod:`gateways.membership.trainer_ledger` and handed to the round engine (through
:meth:`TrainerHost.apply`, the node's), and what the trainer is owed for them — every round's result or an
empty answer, and an ack once a push is counted somewhere safe (:mod:`gateways.node.held_acks`), also
while its trainer is dead (empty contributions, :mod:`gateways.node.trainer_runs`). Which run may train
here is :mod:`gateways.node.trainer_admission`'s.
"""

from __future__ import annotations

import logging
import math
from typing import Protocol

from gateways.config import GatewayConfig
from gateways.membership.job_model import JobModelState, ModelSignature
from gateways.membership.trainer_ledger import TrainerLedger
from gateways.node.actions import NodeAction, RefuseTrainer, ToTrainer
from gateways.node.held_acks import Acks, HeldAcks
from gateways.node.peer_mesh import PeerMesh
from gateways.node.push_stream import PushStreams
from gateways.node.trainer_runs import TrainerRuns
from gateways.rounds.actions import Action, Deliver, DeliverPiece
from gateways.rounds.engine import RoundEngine
from gateways.stats import GatewayStats
from wanrt.errors import LocalProtocolError, RemoteProtocolError
from wanrt.payload import SparsePayload
from wanrt.protocol import Ack, Aggregate, AggregateEnd, AggregatePiece, Message, Push, PushPiece, Telemetry
from wanrt.protocol.limits import MAX_RANK
from wanrt.protocol.peer.contrib_ids import distinct_sites
from wanrt.protocol.peer.site_fault import SiteFault
from wanrt.rank_telemetry import parse_rank_times

__all__ = ["MAX_STREAMING", "TrainerHost", "TrainerSide"]

#: Results being streamed to the trainer at a time (one per open dense round); past it the oldest stream
#: is forgotten, and its round's result goes whole (never wrong, only slower)
MAX_STREAMING = 1024

log = logging.getLogger("gateways.node")


class TrainerHost(Protocol):
    """What the trainer side reads of the node, and what it asks of it: the round engine's actions carried
    out, a payload with NaN/Inf judged."""

    @property
    def engine(self) -> RoundEngine | None: ...

    @property
    def ledger(self) -> TrainerLedger | None: ...

    def apply(self, actions: list[Action], now: float) -> None:
        """Carry out round-engine actions."""

    def non_finite(self, payload: SparsePayload, who: str) -> SparsePayload:
        """A payload with NaN/Inf values: refused (an error) or counted as empty."""
        raise NotImplementedError


class TrainerSide:
    """See the module docstring. ``out`` is the node's action list (shared)."""

    def __init__(
        self,
        cfg: GatewayConfig,
        host: TrainerHost,
        out: list[NodeAction],
        *,
        stats: GatewayStats,
        model: JobModelState,
        mesh: PeerMesh,
        runs: TrainerRuns,
    ) -> None:
        self.cfg = cfg
        self.site = cfg.site
        self.job = cfg.job
        self._host = host
        self._out = out
        self._stats = stats
        self._model = model
        self._mesh = mesh
        self.runs = runs
        self.session: int | None = None  # the current trainer session
        self.streams = PushStreams()  # its streamed pushes being put together
        #: the model the current trainer presented in its handshake
        self.model: ModelSignature | None = None
        self.metrics: dict[str, float] = {}  # the leader's latest per-iteration measurements
        self.iteration = -1
        self.delivered_max = -1  # the newest iteration a round result was delivered for here
        self.held = HeldAcks()  # push acks of results made here, until a peer has the result
        #: when the trainer's resent pushes that no outcome so far reached back to are carried anyway
        self.give_up_at: float | None = None
        self._filling = False  # empty pushes for a dead trainer are being made (no re-entry)
        #: results being streamed: (iteration, layer) -> (trainer session, pieces sent to it)
        self._streaming: dict[tuple[int, int], tuple[int, int]] = {}

    # -- sending -------------------------------------------------------------------------------------

    def send(self, msg: Message) -> None:
        """``msg`` to the trainer connected now (dropped if none is)."""
        if self.session is not None:
            self._out.append(ToTrainer(self.session, msg))

    def send_acks(self, acks: Acks, session: int | None = None) -> None:
        """Push acks to ``session`` (the current one if None)."""
        target = self.session if session is None else session
        if target is None:
            return
        for it, layer in acks:
            self._out.append(ToTrainer(target, Ack(it, layer, 0)))

    # -- the session ---------------------------------------------------------------------------------

    def connect(self, session: int) -> None:
        """Trainer session ``session`` passed its handshake; it replaces any earlier one."""
        old = self.session
        if old is not None:
            log.warning("a new trainer connection replaces an earlier one")
            self._out.append(RefuseTrainer(old, "replaced by a new connection of this site's trainer"))
        self.session = session
        self.runs.connected()
        self.streams.clear()  # the old session's unfinished pushes are never counted
        self._streaming.clear()  # nor do results streamed to it end in the new one: those go whole
        self._stats.trainer_connections += 1

    def disconnect(self, session: int, reason: str, *, clean: bool, now: float) -> bool:
        """Session ``session`` ended; True if it was the current one (``clean``: its ``close()`` said Bye)."""
        if self.session != session:
            return False
        self.session = None
        self.runs.left(clean=clean, reason=reason, next_push=self.next_push(), now=now)
        self.streams.clear()
        return True

    def next_push(self) -> int:
        """The first iteration the trainer has pushed no layer of (0 before any push)."""
        ledger = self._host.ledger
        return 0 if ledger is None else ledger.next_push()

    def replacement_start(self) -> int:
        """Where the restart of a dead trainer starts: after its last push, and after every round whose
        result was delivered here meanwhile (rounds may finish without this site, x-order, before the
        empty pushes start; those results went to no trainer, so the new one must not wait for them)."""
        return max(self.next_push(), self.delivered_max + 1)

    # -- what the trainer sends ----------------------------------------------------------------------

    def check_push(self, push: Push | PushPiece) -> None:
        """A push must name this job and this site (RemoteProtocolError: the trainer's connection ends)."""
        if push.job != self.job or push.sender != self.site:
            raise RemoteProtocolError(
                "push names another job or site", peer="trainer", value=(push.job, push.sender)
            )

    def telemetry(self, msg: Telemetry) -> None:
        """The site leader's measurements of one iteration (bounded by the protocol: MAX_TELEMETRY_KEYS);
        kept until the next report to the scheduler, which sees them as ``trainer.<key>``."""
        if msg.site != self.site:
            raise RemoteProtocolError("telemetry names another site", peer="trainer", value=msg.site)
        world = msg.metrics.get("world_size")
        ws = int(world) if world is not None and math.isfinite(world) and 1 <= world <= MAX_RANK else None
        parse_rank_times(msg.metrics, world_size=ws, peer="trainer")  # RemoteProtocolError: ends the session
        if msg.iteration > self.iteration:
            self.iteration = msg.iteration
            self.metrics = dict(msg.metrics)

    def push(self, session: int, push: Push, now: float) -> None:
        """A push from the trainer. Rounds start once this gateway has joined the job: the driver holds
        pushes until :attr:`GatewayNode.joined` (flow control: the trainer's connection backs up)."""
        if self._host.engine is None or self._host.ledger is None:
            raise LocalProtocolError("trainer push handed to the node before it joined the job")
        self.check_push(push)
        payload = push.payload
        if not payload.is_finite():
            payload = self._host.non_finite(payload, "trainer")
        self._take_push(session, push.iteration, push.layer, payload, now)

    def push_piece(self, session: int, piece: PushPiece, now: float) -> None:
        """A piece of a streamed push (:mod:`gateways.node.push_stream`): kept until the push is whole,
        then counted like a :class:`Push`; meanwhile offered to the engine, which may forward it at once
        if the ledger would hand the whole push over unchanged. NaN/Inf in a piece: ``reject_link`` ends
        the connection; ``drop_payload`` drops that piece's blocks (the rest of the push counts)."""
        engine, ledger = self._host.engine, self._host.ledger
        if engine is None or ledger is None:
            raise LocalProtocolError("trainer push handed to the node before it joined the job")
        self.check_push(piece)
        if session != self.session:
            return  # a replaced connection's last frames
        payload = piece.payload
        if not payload.is_finite():
            payload = self._host.non_finite(payload, "trainer")
        whole = self.streams.add(piece, payload)
        if ledger.fresh(piece.iteration, piece.layer):
            it, layer = piece.iteration, piece.layer
            self._host.apply(engine.local_piece(it, layer, piece.lo, piece.hi, payload, now), now)
        if whole is not None:
            self._take_push(session, piece.iteration, piece.layer, whole, now)

    def _take_push(
        self, session: int, iteration: int, layer: int, payload: SparsePayload, now: float
    ) -> None:
        engine, ledger = self._host.engine, self._host.ledger
        assert engine is not None and ledger is not None
        self._stats.trainer_pushes += 1
        verdict = ledger.on_push(iteration, layer, payload)
        if verdict.acks:
            self.send_acks(verdict.acks, session)
        if iteration < ledger.join_at:  # resent from before a restart: may wait for an outcome
            self.arm_give_up(now)
        if verdict.push is not None:
            it, layer, payload = verdict.push
            self._host.apply(engine.local_push(it, layer, payload, now), now)
            if not engine.is_open(it, layer):
                self.answer_empty(it, layer)  # carried: its round is over here (no-op if answered)
            if not self._model.established and self._model.current is not None:
                self._model.establish()

    def arm_give_up(self, now: float) -> None:
        """A resent push waits for an outcome that reaches back to it: the peers that could send one link
        within the time a silent peer is declared lost, after which it is carried (TrainerLedger.give_up)."""
        ledger = self._host.ledger
        if self.give_up_at is None and ledger is not None and ledger.undecided():
            self.give_up_at = now + self._mesh.lost_after

    def give_up(self, now: float) -> None:
        """The resent pushes no outcome reached back to are carried now, if their time came."""
        if self.give_up_at is not None and now >= self.give_up_at:
            self.give_up_at = None
            ledger = self._host.ledger
            if ledger is not None:
                self.send_acks(ledger.give_up())

    # -- what the trainer is owed: results, empty answers, acks ----------------------------------------

    def deliver(self, d: Deliver, *, from_peer: bool) -> None:
        """A round's result for the trainer (``from_peer``: the result exists at a peer too)."""
        ledger = self._host.ledger
        assert ledger is not None
        acks = ledger.on_deliver(d.layer, d.sites)
        if d.payload is None:
            log.debug("round %s of layer %d has no payload at all; nothing to deliver", d.iteration, d.layer)
            return
        ledger.answer(d.iteration, d.layer)
        self.delivered_max = max(self.delivered_max, d.iteration)
        sites = distinct_sites(d.sites) or (self.site,)
        whole = Aggregate(self.job, d.iteration, d.layer, 0, self.site, d.payload, sites)
        # the trainer session has every piece of the result already: only the end goes (the whole result
        # is still what is kept for a reconnecting trainer)
        sent = self._streaming.pop((d.iteration, d.layer), None)
        end = None
        if d.streamed and self.session is not None and sent == (self.session, d.streamed):
            end = AggregateEnd(self.job, d.iteration, d.layer, 0, self.site, d.streamed, sites)
        self._result(whole, end)
        self._stats.aggregates_delivered += 1
        if acks and not from_peer:
            # a result made here exists nowhere else until a peer has it (gateways.node.held_acks): the
            # acks wait until a peer acknowledged the result's frame; the trainer re-sends them otherwise
            self.held.hold((d.iteration, d.layer), acks)
            return
        self.send_acks(acks)

    def deliver_piece(self, d: DeliverPiece) -> None:
        """A finished piece of a round's result: to the trainer now, while the round's later pieces are
        still on the wire (:mod:`wanrt.protocol.streamed_results`); :meth:`deliver` ends the stream."""
        session = self.session
        if session is None:
            return
        key = (d.iteration, d.layer)
        s, n = self._streaming.pop(key, (session, 0))
        self._streaming[key] = (session, n + 1 if s == session else 1)
        if len(self._streaming) > MAX_STREAMING:
            del self._streaming[next(iter(self._streaming))]
        self.send(AggregatePiece(self.job, d.iteration, d.layer, self.site, d.lo, d.hi, d.payload))

    def answer_empty(self, iteration: int, layer: int) -> None:
        """Round (iteration, layer) ended here without a result: cut off from the others and settled when
        they came back, abandoned, or a push too late for its round. This site's contribution was carried
        into a later round, whose result will count it. The trainer gets an empty aggregate (attributed to
        this site), so that it never waits for a result that will not come."""
        ledger = self._host.ledger
        assert ledger is not None
        shape = ledger.shape(layer)
        self._streaming.pop((iteration, layer), None)
        if shape is None or not ledger.answer(iteration, layer):
            return  # the trainer never pushed this layer, or already has its answer
        empty = SparsePayload.empty(layer, *shape)
        self._result(Aggregate(self.job, iteration, layer, 0, self.site, empty, (self.site,)))

    def _result(self, msg: Aggregate, end: AggregateEnd | None = None) -> None:
        """``msg`` kept until acknowledged, and sent (``end`` instead: the trainer has its pieces)."""
        ledger = self._host.ledger
        assert ledger is not None
        if self.session is None and self.runs.empties_started:
            return  # a result of the empty pushes made for a dead trainer: nobody of that run will ask
        ledger.retain(msg)
        self.send(msg if end is None else end)

    def result_sent(self, peer: str, seq: int, key: tuple[int, int]) -> None:
        """The result of round ``key`` went to ``peer`` in frame ``seq``: its held acks wait for that."""
        if self.held.holds(key):
            self.held.sent(peer, seq, key)

    def release(self, peer: str, seq: int | None) -> None:
        """``peer`` acknowledged our frames up to ``seq`` (None: its link ended): the results made here
        that it now has (or that only waited for it) release their push acks."""
        for acks in self.held.release(peer, seq):
            self.send_acks(acks)

    def release_unsent(self) -> None:
        """Results made here that went to no peer release their push acks: nobody to wait for."""
        if self.held:
            for acks in self.held.unsent():
                self.send_acks(acks)

    def fill_for_dead_trainer(self, now: float) -> None:
        """This site's trainer died: push an empty contribution for it up to the round the others wait
        for (gateways.node.trainer_runs), so the job trains on without its data instead of stalling."""
        engine, ledger = self._host.engine, self._host.ledger
        if self.runs.state != "gone" or self.session is not None:
            return
        if self._filling or engine is None or ledger is None or not self.runs.proxying(now):
            return
        self._filling = True
        try:
            if self.runs.start_told():
                log.warning(
                    "the trainer of this site is gone (%s): rounds go on without this site's data (empty "
                    "contributions) until a trainer of this site starts again (it rejoins at the job's "
                    "iteration and fetches the job's parameters)",
                    self.runs.gone_reason,
                )
                fault = SiteFault(
                    self.site,
                    "trainer_gone",
                    f"the trainer of site {self.site} is gone ({self.runs.gone_reason[:160]}); the job "
                    f"trains on without site {self.site}'s data until it restarts",
                )
                self._mesh.broadcast(fault)
            for it, layer, (dense_len, block_size) in self.runs.fill(
                now, self.delivered_max, ledger.pushed_layers()
            ):
                empty = SparsePayload.empty(layer, dense_len, block_size)
                verdict = ledger.on_push(it, layer, empty)
                if verdict.push is not None:
                    self._host.apply(engine.local_push(*verdict.push, now), now)
        finally:
            self._filling = False
