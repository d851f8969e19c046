"""The gateway's round engine, sans-IO: events in (with ``now``), actions out.

One :class:`RoundEngine` per gateway runs every WAN round (iteration, layer) of its site under the plan
of :mod:`gateways.rounds.topology`. It owns no sockets, tasks or clocks: the asyncio daemon and the
simulator feed
it the same events and carry out the same actions, so its behaviour can be tested on virtual time.

How a round runs at one gateway (a "node"):

1. **Gather.** The node waits for its own trainers' push and for the partial of each child subtree. A child
   gets ``round_deadline_s`` per level of its subtree's height (counted from the round's opening here); a
   straggler attached under parent–child gets only ``t_w_s`` after the node's own push (STAR §IV-B: "a
   parent waits for a certain time t_w after its computation"). When everything arrived or the deadlines
   passed, the node proceeds without the missing ones (x-order, STAR §IV-B).
2. **Forward.** The sum of its own contribution and its children's partials goes up to its parent (tree,
   star, parent–child), or into the ring's sparse reduce-scatter + all-gather (ring, parent–child core), or,
   at the root, becomes the final result (bounded by ``forward_policy``; the remainder stays in this
   gateway's per-layer residual).
3. **Finish.** The final result is delivered to the local trainers and sent down to the children. Every
   site receives the result computed at one place, so all sites get bit-identical aggregates.

Why nothing is lost. A node's own contribution (its push plus what it carries) is named by contribution ids
``(site, iteration)`` and kept until the final result arrives. If the result does not list those ids — the
node's partial was late somewhere — the node folds its contribution into its next round of the same layer,
whose result then says so (``("c", 6)`` inside iteration 7). If no open round will take it along soon —
a persistent straggler's every push arrives after its round finished — the carry is sent ahead as an
``extra`` into the round the parent gathers next (the parent advertises it in its results). Partials of
others are never a node's responsibility, so they can be discarded whenever a round is re-run under a new
plan (a site was lost, rejoined, or the scheduler re-attached a straggler): their originators resend. A
result that exists always wins over a re-run: whoever has it answers re-run messages with it.

Why a quorum. A root proceeds without late children only once a majority of the job's sites contributed
(x-order with x = quorum), and a plan with fewer members than that finishes nothing: a site cut off from
the others holds its contributions instead of training alone. When it rejoins, the others tell it
(``outcome``) which of its contributions they counted; the rest is carried into its first rounds back,
including what it counted in a result it finished just before the cut that never reached the others (its
trainers diverged there and need fresh parameters — the daemon's job).

Limits (bad peer input never crashes or allocates without bound): iterations more than ``window`` ahead of
the newest seen are rejected (:class:`~wanrt.errors.LimitExceeded`), more than ``max_lag`` behind are a
:class:`~wanrt.errors.RemoteProtocolError`; layer ids are below :data:`MAX_LAYERS`; contribution-id lists are
bounded by the site count times ``max_lag + 1``; a peer may only send what its role in the plan allows.

How it is built. The engine owns the open rounds and every decision about them (when to gather, close,
settle, re-run, carry, send ahead); what it keeps beside them, and the rules it consults, are collaborators
it composes, each in its own module:

* :class:`~gateways.rounds.finished.FinishedRounds` — settled rounds, their results and whom they went to;
* :class:`~gateways.rounds.own_ledger.OwnLedger` — this site's own contributions: carries, fold hints;
* :class:`~gateways.rounds.gather_rule.GatherRule` — gather deadlines, x-order and the quorum (STAR §IV-B);
* :class:`~gateways.rounds.core_exchange.CoreExchange` — the core's ring / all-pairs segment exchange and
  streamed pushes;
* :class:`~gateways.rounds.peer_inputs.PeerInputs` — what a peer may send, by its place in the plan;
* :class:`~gateways.rounds.forward_bound.ForwardBound` — the bounded-forwarding policy (StellaTrain §6);
* :class:`~gateways.rounds.layer_formats.LayerFormats` — each layer's shape and wire dtype;
* :class:`~gateways.rounds.held_messages.HeldMessages` — messages held for a plan not adopted yet;
* :class:`~gateways.rounds.rejoin_outcomes.RejoinOutcomes` — what a rejoining peer is told was counted;
* :class:`~gateways.rounds.round_timers.RoundTimers` — the rounds' deadlines and silent-peer suspicion;
* :mod:`~gateways.rounds.result_stream` — result pieces handed to the trainer as they are final.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

from gateways.rounds.actions import Action, Deliver, RoundClosed, Send
from gateways.rounds.aggregate import aggregate
from gateways.rounds.config import MAX_LAYERS, RoundConfig
from gateways.rounds.core_exchange import CoreExchange, Sends
from gateways.rounds.finished import FinishedRounds, Owned
from gateways.rounds.forward_bound import ForwardBound
from gateways.rounds.gather_rule import GatherRule
from gateways.rounds.held_messages import HeldMessages
from gateways.rounds.layer_formats import LayerFormats
from gateways.rounds.own_ledger import OwnLedger
from gateways.rounds.peer_inputs import PeerInputs
from gateways.rounds.rejoin_outcomes import RejoinOutcomes
from gateways.rounds.result_stream import stream_fresh, streamed_result
from gateways.rounds.round_timers import RoundTimers
from gateways.rounds.state import EngineStats, OpenRound, merge_ids
from gateways.rounds.timeline import PlanTimeline
from gateways.rounds.topology import Plan, PlanSpec
from wanrt.config import check
from wanrt.errors import LocalProtocolError, MalformedPayload, RemoteProtocolError
from wanrt.payload import SparsePayload
from wanrt.protocol.peer.contrib_ids import intern_sites, missing_members
from wanrt.protocol.peer.round_msg import ContribId, RoundMsg

__all__ = ["TRAINER", "RoundEngine"]


#: the name under which the local trainers' faults are reported (they are a remote process to the gateway)
TRAINER = "trainer"

Key = tuple[int, int]


class RoundEngine:
    """Sans-IO round engine of gateway ``site`` among the job's ``sites``.

    ``plan`` may be a built :class:`Plan` (its members are the initially live sites), a :class:`PlanSpec`
    (all ``sites`` live) or ``None`` (``config.spec()``). Every event method returns the actions to carry out,
    in order. Call :meth:`tick` at :meth:`next_deadline`. Its parts: see the module docstring.
    """

    def __init__(
        self,
        site: str,
        sites: Iterable[str],
        plan: Plan | PlanSpec | None = None,
        config: RoundConfig | None = None,
        *,
        start_iteration: int = 0,
    ) -> None:
        self.site = site
        self.sites: tuple[str, ...] = tuple(sorted(set(sites)))
        self.config = config if config is not None else RoundConfig()
        check(site in self.sites, "site", site, "must be one of the job's sites")
        check(start_iteration >= 0, "start_iteration", start_iteration, ">= 0")
        if isinstance(plan, Plan):
            spec, live = plan.spec, set(plan.members)
            check(live <= set(self.sites) and site in live, "plan", plan.members, "members must be sites")
        else:
            spec, live = (plan if plan is not None else self.config.spec()), set(self.sites)
        self._timeline = PlanTimeline(spec, live)
        self._max_ids = len(self.sites) * (self.config.max_lag + 1)
        self.stats = EngineStats()
        self._frontier = start_iteration - 1
        self._join_hint = start_iteration - 1
        self._rounds: dict[Key, OpenRound] = {}
        self._finished = FinishedRounds(start_iteration, self.config)
        self._last_push: dict[int, int] = {}
        # partial sums in the wire dtype: a contribution summed with nothing travels as it came in
        self._pass_dtype = self.config.partial_sums == "wire"
        self._formats = LayerFormats(wire_sums=self._pass_dtype)
        self._rule = GatherRule(site, self.config, self.config.quorum or (len(self.sites) // 2 + 1))
        self._forward = ForwardBound(self.config, self._formats.coding)
        self._ledger = OwnLedger(site, self.stats, self._forward, self._finished, pass_dtype=self._pass_dtype)
        self._core = CoreExchange(site, self.config, self._formats, self._forward, self.stats)
        sites_set = intern_sites(self.sites)  # shared by equal engines: see checks.check_message
        self._inputs = PeerInputs(site, sites_set, self.config, self._max_ids, self._formats, self.stats)
        self._timers = RoundTimers(self.config.suspect_after_s)
        self._held = HeldMessages(self.config.max_buffered, self.stats)
        self._outcomes = RejoinOutcomes(site, start_iteration, self.config, self._max_ids)

    # ------------------------------------------------------------------------------------------------
    # public events
    # ------------------------------------------------------------------------------------------------
    def local_push(self, iteration: int, layer: int, payload: SparsePayload, now: float) -> list[Action]:
        """The site's own contribution of ``layer`` at ``iteration``, from its trainers.

        Pushes of a layer must come in increasing iterations. A push for a round already finished here is
        carried into the next round of the layer.
        """
        if iteration < 0 or not 0 <= layer < MAX_LAYERS:
            raise RemoteProtocolError("push for an invalid iteration or layer", peer=TRAINER, value=layer)
        if payload.layer != layer:
            raise MalformedPayload("payload layer disagrees with the push", peer=TRAINER, value=payload.layer)
        if iteration <= self._last_push.get(layer, -1):
            raise RemoteProtocolError(
                "pushes of a layer must come in increasing iterations", peer=TRAINER, value=iteration
            )
        self._formats.check(layer, payload, TRAINER)
        self._last_push[layer] = iteration
        self._formats.pushed(layer, payload)
        out: list[Action] = []
        cid = ((self.site, iteration),)
        if self._is_settled(iteration, layer):
            self._carry_add(layer, payload, cid)
            self._flush(layer, now, out)
            return out
        r = self._rounds.get((iteration, layer)) or self._open(iteration, layer, now, out)
        if r.taken or r.gathered:
            self._carry_add(layer, payload, cid)  # too late for its own round: carried
            self._flush(layer, now, out)
        else:
            r.local, r.local_at = payload, now
        self._advance(r, now, out)
        return out

    def local_piece(
        self, iteration: int, layer: int, lo: int, hi: int, payload: SparsePayload, now: float
    ) -> list[Action]:
        """Blocks ``[lo, hi)`` of the site's push of ``layer`` at ``iteration`` that is still arriving (a
        streamed push, :class:`~wanrt.protocol.PushPiece`): forward the reduce-scatter slices it completes
        now, so the round starts with the first piece instead of after the whole push.

        Only where the whole push would become this member's contribution unchanged: an all-pairs core
        member with no children, no carry to fold, ``forward_policy = "exact"``, a round not gathered yet.
        Otherwise nothing happens here and the round starts when :meth:`local_push` hands the whole push
        (which must follow in every case: a piece is never counted on its own). Once a slice left under the
        round's plan, the round waits for that push (no own deadline: the others already hold part of it;
        its ids go out only with the rest) and this round does not fold the layer's carry (the slices sent
        are the push alone). A piece overlapping one already here is a resent push's (after an interrupted
        stream): it must hold the same blocks and values, else :class:`RemoteProtocolError`."""
        out: list[Action] = []
        if iteration < 0 or not 0 <= layer < MAX_LAYERS:
            raise RemoteProtocolError("piece for an invalid iteration or layer", peer=TRAINER, value=layer)
        if payload.layer != layer:
            raise MalformedPayload("piece layer disagrees with the push", peer=TRAINER, value=payload.layer)
        if iteration <= self._last_push.get(layer, -1) or self._is_settled(iteration, layer):
            return out
        self._formats.check(layer, payload, TRAINER)
        key = (iteration, layer)
        r = self._rounds.get(key)
        if r is None:
            carry = self._ledger.carry(layer)
            if carry is not None and not carry.empty:
                return out  # the push will be folded with it: nothing can leave before it is whole
            r = self._open(iteration, layer, now, out)
        if r.taken or r.gathered or r.local is not None:
            return out
        if not self._core.may_stream(r, self._has_quorum(r.plan)):
            return out
        if not self._core.stream_parts(r, lo, hi, payload):
            return out
        self._formats.default(layer, payload.value_dtype)
        self._send_all(out, self._core.presend(r, now))
        if r.pre_sent:
            self._advance(r, now, out)
        return out

    def peer_message(self, peer: str, msg: RoundMsg, now: float) -> list[Action]:
        """A message from gateway ``peer``; raises a :class:`RemoteProtocolError` subclass if it breaks
        the rules (the daemon then closes that peer's connection)."""
        self._inputs.check_peer(peer)
        out: list[Action] = []
        self._inputs.validate(peer, msg, self._frontier, self._join_hint)
        if msg.kind == "outcome":
            self._on_outcome(peer, msg, now, out)
        else:
            self._dispatch(peer, msg, now, out)
        return out

    def tick(self, now: float) -> list[Action]:
        """Deadlines up to ``now`` have passed: skip late children, report silent peers."""
        out: list[Action] = []
        for r in self._timers.expired(now, self._rounds):
            suspect = self._timers.suspect(r, now)
            if suspect is not None:
                self.stats.suspects += 1
                out.append(suspect)
            self._advance(r, now, out)
        return out

    def next_deadline(self) -> float | None:
        """When :meth:`tick` must be called next (``None``: nothing is waiting on time)."""
        return self._timers.next(self._rounds)

    def peer_lost(self, peer: str, now: float) -> list[Action]:
        """``peer`` was declared lost: rounds in flight are re-run without it under the recomputed plan."""
        self._inputs.check_peer(peer)
        out: list[Action] = []
        if self._timeline.lose(peer):
            self._held.forget(peer)
            self._replan(now, out)
            self._drop_empty_rounds()
        return out

    def _drop_empty_rounds(self) -> None:
        """Rounds left holding nothing once a lost peer's inputs are forgotten (it opened them, e.g. for
        layers this site's trainer never pushes) are freed, not kept until the job ends (reliability item
        11); anything that comes for them later opens them again."""
        for key, r in list(self._rounds.items()):
            if r.holds_nothing():
                del self._rounds[key]

    def peer_joined(self, peer: str, now: float, iteration: int | None = None) -> list[Action]:
        """``peer`` (re)joins and takes part from ``iteration`` on (the same number at every gateway; the
        daemon learns it in the join handshake). The peer is told which of its contributions were counted
        while it was away (``outcome`` messages), so it can settle the rounds it could not finish."""
        join_at = self._frontier + 1 if iteration is None else iteration
        self.known_join(peer, join_at)
        out: list[Action] = []
        # rounds this site could not finish alone get a fresh lease to be settled by the outcome
        for r in self._rounds.values():
            if r.iteration < join_at and not self._has_quorum(r.plan):
                r.age_base = max(r.age_base, join_at)
        self._outcomes.owe(peer, join_at)
        self._send_due_outcomes(out)
        self._replan(now, out)
        return out

    def fresh_peer_joined(self, peer: str, join_at: int, now: float) -> list[Action]:
        """After :meth:`peer_joined` for a peer that restarted with no memory of its rounds (a fresh
        gateway): the rounds before ``join_at`` this site could not finish for want of a quorum wait for
        an ``outcome`` of that peer that never comes — a fresh engine counted nothing and sends none — so
        they aged out only after ``max_lag`` iterations, while the trainers waited for them (issue 21: a
        two-site job, whose survivor alone is no majority, stalled ~60 s after one gateway restarted).
        Settle them now as such an outcome would: nothing of this site counted there, so its
        contributions are carried into the rounds from ``join_at`` and counted once; the restarted site's
        trainers fetch the job's parameters (a resync), so what its old process applied does not matter."""
        del peer  # every quorum-less round waits for the same missing majority
        out: list[Action] = []
        layers: set[int] = set()
        for key in sorted(self._rounds):
            r = self._rounds.get(key)
            if r is not None and r.iteration < join_at and not self._has_quorum(r.plan):
                layers.add(r.layer)
                self._settle(r, set(), 0, now, out)
        for layer in sorted(layers):
            self._finished.settle_below(layer, join_at)
            self._flush(layer, now, out)
        return out

    def known_join(self, peer: str, iteration: int) -> None:
        """The membership part of a join: ``peer`` takes part from ``iteration`` on. :meth:`peer_joined`
        adds the re-plan and the outcomes; a gateway calls this alone, before any round is open, for a join
        it did not see happen: the running gateway that let it in had agreed that ``peer`` takes part from
        ``iteration`` (its handshake's ``joins``). Without it a gateway starting between that agreement and
        ``iteration`` planned ``peer`` into the rounds before it, which no other site does, and waited there
        for a partial that never came (chaos soak, kill2: two restarted gateways, the second let in by a
        third site, wedged the job)."""
        self._inputs.check_peer(peer)
        if iteration < 0:
            raise LocalProtocolError("join iteration must be >= 0", value=iteration)
        self._timeline.join(peer, iteration)
        self._join_hint = max(self._join_hint, iteration - 1)

    def pending_joins(self) -> dict[str, int]:
        """Joins still pending in the open iterations (site -> the iteration it takes part from)."""
        return self._timeline.joins

    def set_plan(
        self, plan: Plan | PlanSpec, now: float, effective_iteration: int | None = None
    ) -> list[Action]:
        """Adopt a new topology (e.g. a straggler re-attached by the scheduler) from ``effective_iteration``
        on, or for every unfinished round if ``None``. Membership stays this engine's own view."""
        spec = plan.spec if isinstance(plan, Plan) else plan
        out: list[Action] = []
        self._timeline.set_spec(spec, -1 if effective_iteration is None else effective_iteration)
        self._replan(now, out)
        return out

    # ------------------------------------------------------------------------------------------------
    # queries
    # ------------------------------------------------------------------------------------------------
    def plan_for(self, iteration: int) -> Plan:
        return self._timeline.plan_for(iteration)

    @property
    def frontier(self) -> int:
        """The newest iteration seen (local pushes and accepted peer messages)."""
        return self._frontier

    @property
    def live(self) -> frozenset[str]:
        return frozenset(self._timeline.live)

    def may_be_behind(self) -> bool:
        """Whether the job may have finished rounds that this site never saw: the sites this site counts
        live are too few to finish a round (it is cut off) and the others are enough without it. Otherwise
        every finished round had a quorum that overlaps this site's live members, so no honest peer is
        more than a few windows past this site's frontier (the join bound, :mod:`gateways.membership`)."""
        quorum = self._rule.quorum
        return len(self._timeline.live) < quorum and len(self.sites) - 1 >= quorum

    def open_rounds(self) -> list[Key]:
        return sorted(self._rounds)

    def is_open(self, iteration: int, layer: int) -> bool:
        return (iteration, layer) in self._rounds

    def has_open_rounds(self) -> bool:
        return bool(self._rounds)

    def oldest_open(self) -> int | None:
        """The oldest iteration with a round open here (None: none open)."""
        return min((i for i, _ in self._rounds), default=None)

    def oldest_unfinished(self) -> int:
        """The oldest iteration with a round still open here (frontier + 1 if none): what a running peer
        that lost this site takes it back from (:func:`gateways.membership.joining.join_iteration`)."""
        oldest = self.oldest_open()
        return max(self._frontier + 1 if oldest is None else oldest, 0)

    def held(self, layer: int) -> list[Owned]:
        """Every piece of this site's mass of ``layer`` not yet in a final result: the carry (with the
        gateway residual) and the own contributions of open rounds. For accounting in tests and metrics."""
        return self._ledger.held(layer, self._rounds)

    # ------------------------------------------------------------------------------------------------
    # round lifecycle
    # ------------------------------------------------------------------------------------------------
    def _is_settled(self, iteration: int, layer: int) -> bool:
        return self._finished.is_settled(iteration, layer)

    def _has_quorum(self, plan: Plan) -> bool:
        return self._rule.has_quorum(plan)

    def _open(self, iteration: int, layer: int, now: float, out: list[Action]) -> OpenRound:
        r = OpenRound(iteration, layer, self._timeline.plan_for(iteration), now, now, iteration)
        self._rounds[(iteration, layer)] = r
        if iteration > self._frontier:
            self._frontier = iteration
            self._prune(now, out)
        return r

    def _carry_add(self, layer: int, payload: SparsePayload | None, ids: tuple[ContribId, ...]) -> None:
        self._ledger.add(layer, payload, ids)

    def _send(self, out: list[Action], peer: str, msg: RoundMsg) -> None:
        # a final keeps the dtype it was made in (narrowed once, where made), whoever passes it on
        sent = msg if msg.kind == "final" else self._formats.narrow(msg)
        r = self._rounds.get((msg.iteration, msg.layer))
        if r is not None:
            r.asked.add(peer)
        out.append(Send(peer, sent, (msg.iteration, msg.layer)))

    def _send_all(self, out: list[Action], sends: Sends) -> None:
        for peer, msg in sends:
            self._send(out, peer, msg)

    def _advance(self, r: OpenRound, now: float, out: list[Action]) -> None:
        """Move ``r`` as far as its inputs and ``now`` allow, then re-arm its timer."""
        key = (r.iteration, r.layer)
        gather_at: float | None = None
        if not r.gathered:  # when to gather: GatherRule
            gather_at = self._rule.deadline(r, now, self._ledger.carry(r.layer), self._core.presending(r))
            if gather_at is None:
                self._gather(r, now, out)
                if key not in self._rounds:
                    return
        if r.ring_slices is not None or (r.plan.all_pairs and self._core.presending(r)):
            self._ring_progress(r, now, out)
            if key not in self._rounds:
                return
        stream_fresh(r, self.config.stream_results, out)  # result pieces final here: to the trainer
        self._timers.rearm(r, None if gather_at == math.inf else gather_at)

    def _gather(self, r: OpenRound, now: float, out: list[Action]) -> None:
        r.gathered = True
        plan = r.plan
        r.late.update(c for c in plan.children_of(self.site) if c not in r.inputs)
        self._ledger.take_own(r, self._core.presending(r))  # push plus the layer's carry
        # a fixed order (by site name), not arrival order: fp32 addition is not associative, and every run
        # of the same pushes, on real daemons or in the simulator, must sum to the same bits
        senders = sorted(r.inputs)
        extras = sorted(r.extras_in)
        contrib = aggregate(
            [r.own] + [r.inputs[s].payload for s in senders] + [r.extras_in[s][0] for s in extras],
            peers=[None, *senders, *extras],
            keep_dtype=self._pass_dtype,
        )
        ids = merge_ids(
            r.own_ids, *(r.inputs[s].sites for s in senders), *(r.extras_in[s][1] for s in extras)
        )
        parent = plan.parent_of(self.site)
        if parent is not None:
            self._send(out, parent, RoundMsg("partial", r.iteration, r.layer, plan.plan_id, contrib, ids))
            r.wait_peer, r.wait_since, r.wait_reason = parent, now, "final"
        elif not self._has_quorum(plan):
            return  # cut off from the majority: hold everything until the plan changes
        elif len(plan.core) == 1:
            kept, rest = self._forward.bound(contrib, None)
            if rest is not None:
                r.residuals[plan.plan_id] = rest
            final = RoundMsg("final", r.iteration, r.layer, plan.plan_id, kept, ids)
            self._close(r, self._formats.narrow(final), None, now, out)
        else:
            self._send_all(out, self._core.start(r, contrib, ids, now))

    def _close(
        self, r: OpenRound, final: RoundMsg, source: str | None, now: float, out: list[Action]
    ) -> None:
        """``final`` is the result of ``r`` here: deliver, settle own contribution, pass it on."""
        key = (r.iteration, r.layer)
        del self._rounds[key]
        targets = self._finished.record(key, final, r.plan, source, self.site)
        self.stats.rounds_closed += 1
        stream_fresh(r, self.config.stream_results, out)
        streamed = streamed_result(r, final.payload, source is None)  # the pieces handed over are it?
        out.append(Deliver(r.iteration, r.layer, final.payload, final.sites, streamed))
        if source is not None and source == r.plan.parent_of(self.site):
            self._ledger.note_hint(r.layer, final.step)
        self._ledger.closed(r, final)
        self._outcomes.count(r.layer, final.sites)
        plan = r.plan
        if targets:
            down = self._with_hint(final)
            for t in targets:
                self._send(out, t, down)
        if self._held:
            self._answer_held(key, out)
        out.append(
            RoundClosed(
                r.iteration,
                r.layer,
                final.sites,
                missing_members(final.sites, plan.members),
                tuple(sorted(r.late)),
                now - r.first_opened,
            )
        )
        self._flush(r.layer, now, out)
        if self._outcomes:
            self._send_due_outcomes(out)

    def _with_hint(self, final: RoundMsg) -> RoundMsg:
        """``final`` as this node sends it, with ``step`` = the fold hint: the first round of the layer this
        node has not gathered and whose own push has not arrived (rounds that have it finish within
        ``t_w``, too soon for a child's extra to make it)."""
        layer = final.layer
        i = self._finished.newest_final(layer) + 1
        while i <= self._frontier:
            r = self._rounds.get((i, layer))
            if r is None:
                if not self._is_settled(i, layer):
                    break
            elif not r.gathered and r.local is None and not r.taken:
                break  # still waiting for this node's own push: an extra sent now will be in time
            i += 1
        return final if final.step == i else dataclasses.replace(final, step=i)

    def _flush(self, layer: int, now: float, out: list[Action]) -> None:
        """Send what this site carries for ``layer`` ahead to its parent (an ``extra``), unless an open
        round will take it along with the next push anyway. Without this a persistent straggler, whose
        every push arrives after its round finished, would never get its contributions counted."""
        c = self._ledger.carry(layer)
        if c is None or not c.ids:
            return
        for (_, lay), r in self._rounds.items():
            if lay == layer and not r.taken and not r.gathered:
                return
        target = max(self._ledger.hint(layer), self._finished.newest_final(layer) + 1)
        target = min(target, max(self._frontier, self._join_hint) + self.config.window)
        # never into a round older than a contribution it carries: a peer refuses an id from the future
        # (chaos soak: a carried (b, 24) sent ahead into round 23 made a drop b, take it back at 23 and
        # drop it again, in a loop that wedged the job; the carry of a settled round is one way to it)
        target = max(target, max(it for _, it in c.ids))
        while self._is_settled(target, layer):
            target += 1
        plan = self._timeline.plan_for(target)
        parent = plan.parent_of(self.site)
        if parent is None or not self._has_quorum(plan):
            return  # a root or ring member: its next gather takes the carry
        r = self._rounds.get((target, layer)) or self._open(target, layer, now, out)
        payload, ids = self._ledger.send_ahead(layer, len(plan.members))
        r.extras_out.append((payload, ids))
        self._send(out, parent, RoundMsg("extra", target, layer, plan.plan_id, payload, ids))
        if r.timer is None:
            self._advance(r, now, out)

    def _settle(
        self, r: OpenRound, counted: set[int] | None, since: int, now: float, out: list[Action]
    ) -> None:
        """Close ``r`` without a result: ``counted`` are this site's iterations a peer saw in results
        (``None``: unknown, the round is abandoned). Uncounted contributions are carried."""
        del self._rounds[(r.iteration, r.layer)]
        self._finished.settle(r.iteration, r.layer)
        self._ledger.settled(r, counted, since)
        self.stats.settled += counted is not None
        out.append(
            RoundClosed(
                r.iteration, r.layer, (), r.plan.members, tuple(sorted(r.late)), now - r.first_opened, False
            )
        )
        if self._outcomes:
            self._send_due_outcomes(out)

    # ------------------------------------------------------------------------------------------------
    # peer messages
    # ------------------------------------------------------------------------------------------------
    def _dispatch(self, peer: str, m: RoundMsg, now: float, out: list[Action]) -> None:
        key = (m.iteration, m.layer)
        if key in self._finished:
            self._answer_finished(peer, m, out)
            return
        if self._is_settled(m.iteration, m.layer):
            self.stats.stale_ignored += 1
            return
        if m.kind == "final":
            existing = self._rounds.get(key)
            parent = self._timeline.plan_for(m.iteration).parent_of(self.site)
            if not self._inputs.may_finalize(peer, parent, existing):
                # never applied, but not a reason to close the link either: right after a partition two
                # sites may briefly run different plans, and closing on such finals cascaded into a wedged
                # job in the chaos soak; the right parent's result (or a re-run answered) follows
                self.stats.foreign_finals += 1
                return
            r = existing or self._open(m.iteration, m.layer, now, out)
            self._close(r, m, peer, now, out)
            return
        if peer not in self._timeline.live:
            self.stats.stale_ignored += 1  # a lost site's partials: it keeps its own contributions
            return
        plan = self._timeline.plan_for(m.iteration)
        if m.plan_id != plan.plan_id:
            self._held.hold(peer, m)
            return
        r = self._rounds.get(key) or self._open(m.iteration, m.layer, now, out)
        if m.kind == "partial":
            if self._inputs.take_partial(peer, r, m):
                self._advance(r, now, out)
        elif m.kind == "extra":
            self._inputs.take_extra(peer, r, m)
        elif m.kind == "segment":
            self._core.take_segment(peer, r, m)
            self._advance(r, now, out)
        else:
            self._send_all(out, self._core.take_segment_final(peer, r, m, now))
            self._advance(r, now, out)

    def _answer_finished(self, peer: str, m: RoundMsg, out: list[Action]) -> None:
        """A message for a round with a result here: a peer re-running it gets the result."""
        final = self._finished.reply(peer, m, self.stats)
        if final is not None:
            self._send(out, peer, self._with_hint(final))

    def _answer_held(self, key: Key, out: list[Action]) -> None:
        """The round ``key`` just got its result here: whoever sent us messages for it under a plan we did
        not run (held for a re-plan that will now never come) is answered with the result, as a message
        arriving after the result would be (:meth:`_answer_finished`). Without this, after a partition
        between two sites (each dropped the other, the rest dropped neither) a site whose parent differs
        in its plan sent that parent its partial, the parent held it and finished the round under its own
        plan, and the site waited for the result forever with the parent's link up (the chaos soak's
        wedge after a short partition)."""
        for peer, m in self._held.take_round(key):
            self._answer_finished(peer, m, out)

    def _ring_progress(self, r: OpenRound, now: float, out: list[Action]) -> None:
        sends, final = self._core.progress(r, now)
        self._send_all(out, sends)
        if final is not None:
            self._close(r, self._formats.narrow(final), None, now, out)

    # ------------------------------------------------------------------------------------------------
    # plan changes, rejoin outcomes, pruning
    # ------------------------------------------------------------------------------------------------
    def _replan(self, now: float, out: list[Action]) -> None:
        """Re-run unfinished rounds whose plan changed; offer finished results to new neighbours."""
        restarted = []
        for r in list(self._rounds.values()):
            plan = self._timeline.plan_for(r.iteration)
            if plan.plan_id != r.plan.plan_id:
                for p, ids in r.restart(plan, now):
                    self._carry_add(r.layer, p, ids)
                self.stats.restarts += 1
                restarted.append(r)
        for t, final in self._finished.offers(self._timeline.plan_for, self.site):
            self._send(out, t, self._with_hint(final))  # whoever finishes rounds changed
        for peer, q in self._held.take_all().items():
            for m in q:
                try:
                    self._dispatch(peer, m, now, out)
                except RemoteProtocolError:
                    self.stats.buffer_dropped += 1
        for r in restarted:
            if (r.iteration, r.layer) in self._rounds:
                self._advance(r, now, out)
        for layer in self._ledger.owing_layers():
            self._flush(layer, now, out)

    def _send_due_outcomes(self, out: list[Action]) -> None:
        """Tell rejoined peers what was counted once it is known: once this site finished its own rounds
        before the join (those that can finish: with a quorum; :mod:`gateways.rounds.rejoin_outcomes`)."""

        def blocked(join_at: int) -> bool:
            return any(r.iteration < join_at and self._has_quorum(r.plan) for r in self._rounds.values())

        for peer, join_at in self._outcomes.ready(self._timeline.live, blocked):
            for msg in self._outcomes.messages(peer, join_at, self._formats.layers()):
                self._send(out, peer, msg)

    def _on_outcome(self, peer: str, m: RoundMsg, now: float, out: list[Action]) -> None:
        join_at, since, layer = m.iteration, m.step, m.layer
        if self._has_quorum(self._timeline.plan_for(max(join_at - 1, 0))) and not any(
            not self._has_quorum(r.plan) for r in self._rounds.values() if r.iteration < join_at
        ):
            return  # this site was not cut off: its own rounds finish normally
        counted = {it for _, it in m.sites}
        for key in sorted(self._rounds):
            r = self._rounds[key]
            if r.layer == layer and r.iteration < join_at and not self._has_quorum(r.plan):
                self._settle(r, counted, since, now, out)
        # rounds this site finished just before it was cut off may have been re-run without it
        self._ledger.rejoined(layer, join_at, counted, since)
        self._finished.settle_below(layer, join_at)
        self._flush(layer, now, out)

    def _prune(self, now: float, out: list[Action]) -> None:
        """Bound memory as the frontier advances: old rounds, results, ids and held messages go."""
        floor = self._frontier - self.config.max_lag
        if floor <= self._finished.floor:
            return
        for key in sorted(self._rounds):
            r = self._rounds.get(key)
            if r is not None and r.age_base < floor:
                self._settle(r, None, 0, now, out)
        self._finished.prune(self._frontier, floor)
        self._held.prune(floor)
        self._timeline.forget_before(floor)
        self._finished.floor = floor

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"RoundEngine({self.site!r}, open={len(self._rounds)}, frontier={self._frontier})"
