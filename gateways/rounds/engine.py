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
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import math
from collections import deque
from collections.abc import Iterable, Sequence

import numpy as np

from gateways.rounds.actions import Action, Deliver, PeerSuspect, RoundClosed, Send
from gateways.rounds.aggregate import aggregate, aggregate_cap, per_site_cap, top_blocks
from gateways.rounds.allpairs import (
    allpairs_presend,
    allpairs_reduce,
    allpairs_result,
    allpairs_start,
    allpairs_waiting_on,
    piece_count,
    take_part,
    take_segment_final,
)
from gateways.rounds.checks import check_allpairs_message, check_message, check_ring_message
from gateways.rounds.config import MAX_LAYERS, RoundConfig
from gateways.rounds.counted_log import CountedLog
from gateways.rounds.ring import ring_result, ring_start, ring_steps, take_segment_result, take_segment_step
from gateways.rounds.state import Carry, EngineStats, OpenRound, merge_ids
from gateways.rounds.timeline import PlanTimeline
from gateways.rounds.topology import Plan, PlanSpec
from wanrt.codec.value_casts import in_wire_dtype
from wanrt.config import check
from wanrt.errors import LocalProtocolError, MalformedPayload, RemoteProtocolError
from wanrt.payload import SparsePayload
from wanrt.protocol.peer.contrib_ids import id_pairs, intern_sites, missing_members
from wanrt.protocol.peer.round_msg import ContribId, RoundMsg

__all__ = ["TRAINER", "RoundEngine"]


def _same_payload(a: SparsePayload, b: SparsePayload) -> bool:
    """The same blocks with the same value bits (a resent piece of a streamed push)."""
    return (
        a.value_dtype == b.value_dtype
        and np.array_equal(a.indices, b.indices)
        and np.array_equal(a.values.view(np.uint8), b.values.view(np.uint8))
    )


#: the name under which the local trainers' faults are reported (they are a remote process to the gateway)
TRAINER = "trainer"

Key = tuple[int, int]


class RoundEngine:
    """Sans-IO round engine of gateway ``site`` among the job's ``sites``.

    ``plan`` may be a built :class:`Plan` (its members are the initially live sites), a :class:`PlanSpec`
    (all ``sites`` live) or ``None`` (``config.spec()``). Every event method returns the actions to carry out,
    in order. Call :meth:`tick` at :meth:`next_deadline`.
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
        self._site_set = intern_sites(self.sites)  # shared by equal engines: see checks.check_message
        self._timeline = PlanTimeline(spec, live)
        self._quorum = self.config.quorum or (len(self.sites) // 2 + 1)
        self._max_ids = len(self.sites) * (self.config.max_lag + 1)
        self.stats = EngineStats()
        self._frontier = start_iteration - 1
        self._join_hint = start_iteration - 1
        self._rounds: dict[Key, OpenRound] = {}
        self._finals: dict[Key, RoundMsg] = {}
        self._final_plan: dict[Key, Plan] = {}
        self._final_sent: dict[Key, dict[str, int]] = {}  # peer -> plan id it was sent under
        # own contributions counted in results here, kept as long as the results: if this site was cut off
        # right after finishing a round, the others re-ran it without them (see _on_outcome)
        self._final_own: dict[Key, list[tuple[SparsePayload | None, tuple[ContribId, ...]]]] = {}
        self._done: dict[int, set[int]] = {}  # layer -> settled iterations (>= the prune floor)
        self._done_below: dict[int, int] = {}  # layer -> every iteration below is settled (after rejoin)
        self._carry: dict[int, Carry] = {}
        self._newest_final: dict[int, int] = {}  # layer -> newest iteration with a result here
        self._hint: dict[int, int] = {}  # layer -> where the parent gathers next (its last fold hint)
        self._shapes: dict[int, tuple[int, int]] = {}
        self._last_push: dict[int, int] = {}
        self._wire: dict[int, str] = {}  # layer -> the value dtype its payloads travel in
        self._heap: list[tuple[float, int, Key]] = []
        self._seq = 0
        self._buffer: dict[str, deque[RoundMsg]] = {}
        # every peer's contributions counted in results here, as ranges of iterations from the start on:
        # what a rejoining peer is told was counted, however long it was away (gateways.rounds.counted_log)
        self._counted = CountedLog(start_iteration, self.config.outcome_ranges, skip=site)
        self._own_since = start_iteration  # _final_own holds no key below this
        self._outcome_due: dict[str, int] = {}  # peer -> join_at: its outcomes wait for our rounds before
        self._floor = start_iteration - self.config.max_lag  # iterations below are settled here
        # with partial sums in the wire dtype, a contribution that is not summed with anything travels
        # in the dtype it came in (no widening to fp32 and narrowing back, which give the same bits)
        self._pass_dtype = self.config.partial_sums == "wire"

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
        self._check_shape(layer, payload, TRAINER)
        self._last_push[layer] = iteration
        self._wire[layer] = payload.value_dtype
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
        self._check_shape(layer, payload, TRAINER)
        shape = self._shapes[layer]
        key = (iteration, layer)
        r = self._rounds.get(key)
        if r is None:
            carry = self._carry.get(layer)
            if carry is not None and not carry.empty:
                return out  # the push will be folded with it: nothing can leave before it is whole
            r = self._open(iteration, layer, now, out)
        if r.taken or r.gathered or r.local is not None:
            return out
        plan = r.plan
        if (
            not plan.all_pairs
            or len(plan.core) < 2
            or not plan.in_core(self.site)
            or plan.children_of(self.site)
            or not self._has_quorum(plan)
            or self.config.forward_policy != "exact"
        ):
            return out
        if not self._stream_parts(r, lo, hi, payload):
            return out
        if r.pre_plan != plan.plan_id:
            r.pre_plan, r.pre_sent = plan.plan_id, set()
        self._wire.setdefault(layer, payload.value_dtype)
        ids = r.ring_ids = ((self.site, iteration),)  # as allpairs_start will say (nothing folded)
        for to, msg in allpairs_presend(r, self.site, shape, self._pieces(r), ids):
            self._send(out, to, msg)
            self.stats.streamed_slices += 1
        if r.pre_sent:
            r.wait_since, r.wait_reason = now, "ring"
            self._advance(r, now, out)
        return out

    def _stream_parts(self, r: OpenRound, lo: int, hi: int, payload: SparsePayload) -> bool:
        """Keep piece ``[lo, hi)`` of a streamed push; False if it repeats one here (same bytes)."""
        parts = r.pre_parts
        i = bisect.bisect_left(parts, lo, key=lambda x: x[0])
        for a, b, p in parts[max(0, i - 1) : i + 1]:
            if a < hi and lo < b:
                if (a, b) != (lo, hi) or not _same_payload(p, payload):
                    raise RemoteProtocolError(
                        "a resent streamed push differs from the pieces already forwarded",
                        peer=TRAINER,
                        value=(lo, hi),
                    )
                return False
        parts.insert(i, (lo, hi, payload))
        return True

    def _presending(self, r: OpenRound) -> bool:
        """Slices of this site's streamed push left under the round's current plan."""
        return bool(r.pre_sent) and r.pre_plan == r.plan.plan_id

    def peer_message(self, peer: str, msg: RoundMsg, now: float) -> list[Action]:
        """A message from gateway ``peer``; raises a :class:`RemoteProtocolError` subclass if it breaks
        the rules (the daemon then closes that peer's connection)."""
        self._check_peer(peer)
        out: list[Action] = []
        self._validate(peer, msg)
        if msg.kind == "outcome":
            self._on_outcome(peer, msg, now, out)
        else:
            self._dispatch(peer, msg, now, out)
        return out

    def tick(self, now: float) -> list[Action]:
        """Deadlines up to ``now`` have passed: skip late children, report silent peers."""
        out: list[Action] = []
        while self._heap and self._heap[0][0] <= now:
            t, _, key = heapq.heappop(self._heap)
            r = self._rounds.get(key)
            if r is None or r.timer != t:
                continue
            r.timer = None
            if (
                r.wait_peer is not None
                and not r.suspected
                and now >= r.wait_since + self.config.suspect_after_s
            ):
                r.suspected = True
                self.stats.suspects += 1
                out.append(PeerSuspect(r.wait_peer, r.iteration, r.layer, now - r.wait_since, r.wait_reason))
            self._advance(r, now, out)
        return out

    def next_deadline(self) -> float | None:
        """When :meth:`tick` must be called next (``None``: nothing is waiting on time)."""
        while self._heap:
            t, _, key = self._heap[0]
            r = self._rounds.get(key)
            if r is not None and r.timer == t:
                return t
            heapq.heappop(self._heap)
        return None

    def peer_lost(self, peer: str, now: float) -> list[Action]:
        """``peer`` was declared lost: rounds in flight are re-run without it under the recomputed plan."""
        self._check_peer(peer)
        out: list[Action] = []
        if self._timeline.lose(peer):
            self._buffer.pop(peer, None)
            self._replan(now, out)
            self._drop_empty_rounds()
        return out

    def _drop_empty_rounds(self) -> None:
        """Rounds left holding nothing once a lost peer's inputs are forgotten (it opened them, e.g. for
        layers this site's trainer never pushes) are freed, not kept until the job ends (reliability item
        11); anything that comes for them later opens them again."""
        for key, r in list(self._rounds.items()):
            if (
                r.local is None
                and r.own is None
                and not r.own_ids
                and not r.taken
                and not r.inputs
                and not r.extras_in
                and not r.extras_out
                and r.ring_slices is None
                and not r.ring_recv
                and not r.seg_finals
                and not r.ap_sums
                and not r.ap_recv
                and not r.ap_finals
                and not r.residuals
            ):
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
        self._outcome_due[peer] = join_at
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
            self._done_below[layer] = max(self._done_below.get(layer, -1), join_at)
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
        self._check_peer(peer)
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
        return len(self._timeline.live) < self._quorum and len(self.sites) - 1 >= self._quorum

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

    def held(self, layer: int) -> list[tuple[SparsePayload | None, tuple[ContribId, ...]]]:
        """Every piece of this site's mass of ``layer`` not yet in a final result: the carry (with the
        gateway residual) and the own contributions of open rounds. For accounting in tests and metrics."""
        out: list[tuple[SparsePayload | None, tuple[ContribId, ...]]] = []
        c = self._carry.get(layer)
        if c is not None and not c.empty:
            out.append((c.payload, c.ids))
        for (_, lay), r in sorted(self._rounds.items()):
            if lay != layer:
                continue
            if r.taken and r.own_ids:
                out.append((r.own, r.own_ids))
            if r.local is not None:
                out.append((r.local, ((self.site, r.iteration),)))
            out.extend(r.extras_out)
        return out

    # ------------------------------------------------------------------------------------------------
    # validation
    # ------------------------------------------------------------------------------------------------
    def _check_peer(self, peer: str) -> None:
        if peer not in self._site_set:
            raise RemoteProtocolError("unknown site", peer=peer)
        if peer == self.site:
            raise LocalProtocolError("a gateway cannot be its own peer", peer=peer)

    def _check_shape(self, layer: int, p: SparsePayload, who: str) -> None:
        shape = self._shapes.get(layer)
        if shape is None:
            self._shapes[layer] = (p.dense_len, p.block_size)
        elif shape != (p.dense_len, p.block_size):
            raise MalformedPayload(
                f"layer {layer}: (dense_len, block_size) {(p.dense_len, p.block_size)} != known {shape}",
                peer=who,
                value=(p.dense_len, p.block_size),
            )

    def _validate(self, peer: str, m: RoundMsg) -> None:
        check_message(
            peer,
            m,
            site=self.site,
            sites=self._site_set,
            lowest=self._frontier - self.config.max_lag,
            highest=max(self._frontier, self._join_hint) + self.config.window,
            max_ids=self._max_ids,
        )
        if m.payload is not None:
            self._check_shape(m.layer, m.payload, peer)

    # ------------------------------------------------------------------------------------------------
    # round lifecycle
    # ------------------------------------------------------------------------------------------------
    def _is_settled(self, iteration: int, layer: int) -> bool:
        if (iteration, layer) in self._finals:
            return True
        if iteration < self._done_below.get(layer, -1) or iteration < self._floor:
            return True
        return iteration in self._done.get(layer, ())

    def _has_quorum(self, plan: Plan) -> bool:
        return len(plan.members) >= self._quorum

    def _open(self, iteration: int, layer: int, now: float, out: list[Action]) -> OpenRound:
        r = OpenRound(iteration, layer, self._timeline.plan_for(iteration), now, now, iteration)
        self._rounds[(iteration, layer)] = r
        if iteration > self._frontier:
            self._frontier = iteration
            self._prune(now, out)
        return r

    def _carry_add(self, layer: int, payload: SparsePayload | None, ids: tuple[ContribId, ...]) -> None:
        c = self._carry.get(layer)
        if c is None:
            c = self._carry[layer] = Carry()
        c.add(payload, ids)
        if ids:
            self.stats.carried += 1

    def _send(self, out: list[Action], peer: str, msg: RoundMsg) -> None:
        # a final keeps the dtype it was made in (narrowed once, where made), whoever passes it on
        sent = msg if msg.kind == "final" else self._narrow(msg)
        r = self._rounds.get((msg.iteration, msg.layer))
        if r is not None:
            r.asked.add(peer)
        out.append(Send(peer, sent, (msg.iteration, msg.layer)))

    def _narrow(self, msg: RoundMsg) -> RoundMsg:
        """``msg`` with its payload in the layer's wire dtype (``partial_sums = "wire"``): the dtype this
        site's trainers push, else the one its peers send. A final is narrowed once, where it is made,
        so every site delivers the very same values."""
        p = msg.payload
        if p is None or self.config.partial_sums != "wire":
            return msg
        dtype = self._wire.get(msg.layer) or self._wire.setdefault(msg.layer, p.value_dtype)
        if dtype == p.value_dtype:
            return msg
        return dataclasses.replace(msg, payload=in_wire_dtype(p, dtype))

    def _advance(self, r: OpenRound, now: float, out: list[Action]) -> None:
        """Move ``r`` as far as its inputs and ``now`` allow, then re-arm its timer."""
        key = (r.iteration, r.layer)
        gather_at: float | None = None
        if not r.gathered:
            gather_at = self._gather_deadline(r, now)
            if gather_at is None:
                self._gather(r, now, out)
                if key not in self._rounds:
                    return
        if r.ring_slices is not None or (r.plan.all_pairs and self._presending(r)):
            self._ring_progress(r, now, out)
            if key not in self._rounds:
                return
        due = None if gather_at == math.inf else gather_at
        if r.wait_peer is not None and not r.suspected:
            t = r.wait_since + self.config.suspect_after_s
            due = t if due is None else min(due, t)
        if due != r.timer:
            r.timer = due
            if due is not None:
                self._seq += 1
                heapq.heappush(self._heap, (due, self._seq, key))

    def _gather_deadline(self, r: OpenRound, now: float) -> float | None:
        """``None`` if the node may proceed now, else the earliest time something it waits for expires
        (``math.inf``: nothing expires, it waits for more contributions)."""
        cfg = self.config
        pending: list[float] = []
        own_due = r.opened_at + cfg.round_deadline_s
        if r.local is None and not r.taken and self._presending(r):
            return math.inf  # part of the push is out: the round waits for the rest of it
        if r.local is None and not r.taken and now < own_due:
            pending.append(own_due)
        plan = r.plan
        for c in plan.children_of(self.site):
            if c in r.inputs:
                continue
            if c in plan.waits_tw:
                base = None if r.local_at is None else max(r.local_at, r.opened_at)
                t_w = cfg.t_w_s if plan.spec.t_w_s is None else plan.spec.t_w_s  # a scheduler's Eq. 3 t_w
                due = own_due if base is None else base + t_w
            else:
                due = r.opened_at + cfg.round_deadline_s * (1 + plan.height_of(c))
            if now < due:
                pending.append(due)
        if pending:
            x = plan.spec.x_order
            if x and plan.parent_of(self.site) is None and len(plan.core) == 1 and self._contributors(r) >= x:
                return None  # STAR §IV-B static x-order: the first x sites are enough, the rest comes late
            return min(pending)
        if plan.parent_of(self.site) is None and len(plan.core) == 1 and not self._enough_sites(r):
            return math.inf
        return None

    def _contributors(self, r: OpenRound) -> int:
        """Distinct sites whose contributions this node holds for ``r`` (own push, carry, children)."""
        sites = {s for s, _ in r.own_ids}
        if r.local is not None:
            sites.add(self.site)
        c = self._carry.get(r.layer)
        if not r.taken and c is not None:
            sites.update(s for s, _ in c.ids)
        for m in r.inputs.values():
            sites.update(s for s, _ in m.sites)
        for _, ids in r.extras_in.values():
            sites.update(s for s, _ in ids)
        return len(sites)

    def _enough_sites(self, r: OpenRound) -> bool:
        """STAR §IV-B x-order with x = quorum: a root proceeds without late children only once that many
        sites contributed, so a root cut off from everybody (before anyone declares it lost) does not go on
        finishing rounds with its own push alone."""
        return self._contributors(r) >= self._quorum or all(
            c in r.inputs for c in r.plan.children_of(self.site)
        )

    def _take_own(self, r: OpenRound) -> None:
        """Fix this site's contribution to ``r``: its push plus the layer's carry (bounded per policy)."""
        if r.taken:
            return
        # slices of a streamed push already left: the push alone is the contribution, the carry waits
        held = self._presending(r)
        carry = None if held else self._carry.get(r.layer)
        if carry is not None and carry.ids and max(it for _, it in carry.ids) > r.iteration:
            # it holds a contribution newer than this round (a round re-run after a rejoin): a peer refuses
            # ids from the future, so a later round takes it (the carry's payload is one sum: all or none)
            carry = None
        ids: tuple[ContribId, ...] = ((self.site, r.iteration),) if r.local is not None else ()
        if carry is not None and carry.ids:
            ids = merge_ids(ids, carry.ids)
        if not ids:
            return  # nothing attributable: a residual alone waits for the next real contribution
        own = aggregate([r.local, None if carry is None else carry.payload], keep_dtype=self._pass_dtype)
        rest: SparsePayload | None = None
        if own is not None and self.config.forward_policy == "per_site":
            cap = per_site_cap(
                own.dense_len, own.block_size, self.config.forward_density, len(r.plan.members)
            )
            own, rest = top_blocks(own, cap)
        kept = rest if rest is not None and rest.nnz_blocks else None
        r.pre_parts = []
        if carry is not None or r.layer not in self._carry:
            self._carry[r.layer] = Carry(kept)
        elif kept is not None:  # the carry was not folded (held back, or newer): it keeps the remainder too
            self._carry_add(r.layer, kept, ())
        r.own, r.own_ids, r.taken, r.local = own, ids, True, None

    def _gather(self, r: OpenRound, now: float, out: list[Action]) -> None:
        r.gathered = True
        plan = r.plan
        r.late.update(c for c in plan.children_of(self.site) if c not in r.inputs)
        self._take_own(r)
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
            kept, rest = self._bound(contrib, None)
            if rest is not None:
                r.residuals[plan.plan_id] = rest
            final = RoundMsg("final", r.iteration, r.layer, plan.plan_id, kept, ids)
            self._close(r, self._narrow(final), None, now, out)
        else:
            self._ring_start(r, contrib, ids, now, out)

    def _bound(
        self, p: SparsePayload | None, scope_blocks: int | None
    ) -> tuple[SparsePayload | None, SparsePayload | None]:
        """Apply the ``cap`` policy to a final (or a ring segment of ``scope_blocks`` blocks)."""
        if p is None or self.config.forward_policy != "cap":
            return p, None
        if scope_blocks is None:
            cap = aggregate_cap(p.dense_len, p.block_size, self.config.forward_density)
        else:
            cap = max(1, math.ceil(self.config.forward_density * scope_blocks))
        kept, rest = top_blocks(p, cap)
        return kept, (rest if rest.nnz_blocks else None)

    def _close(
        self, r: OpenRound, final: RoundMsg, source: str | None, now: float, out: list[Action]
    ) -> None:
        """``final`` is the result of ``r`` here: deliver, settle own contribution, pass it on."""
        key = (r.iteration, r.layer)
        del self._rounds[key]
        self._finals[key] = final
        self._final_plan[key] = r.plan
        sent = self._final_sent[key] = {}
        self._done.setdefault(r.layer, set()).add(r.iteration)
        self.stats.rounds_closed += 1
        out.append(Deliver(r.iteration, r.layer, final.payload, final.sites))
        if r.iteration > self._newest_final.get(r.layer, -1):
            self._newest_final[r.layer] = r.iteration
        if source is not None and source == r.plan.parent_of(self.site):
            self._hint[r.layer] = max(self._hint.get(r.layer, -1), final.step)
        res = r.residuals.get(final.plan_id)
        if res is not None:
            self._carry_add(r.layer, res, ())
        included = id_pairs(final.sites)
        counted: list[tuple[SparsePayload | None, tuple[ContribId, ...]]] = []
        for p, ids in [(r.own, r.own_ids), *r.extras_out] if r.taken and r.own_ids else r.extras_out:
            hit = [x in included for x in ids]
            if all(hit):
                counted.append((p, ids))
            else:
                if any(hit):
                    self.stats.conflicts += 1
                self._carry_add(r.layer, p, ids)
        if counted:
            self._final_own[key] = counted
        if r.local is not None:
            self._carry_add(r.layer, r.local, ((self.site, r.iteration),))
        self._counted.add(r.layer, final.sites)
        plan = r.plan
        if source is None:
            targets: Sequence[str] = plan.children_of(self.site)
        else:
            sent[source] = final.plan_id
            targets = [n for n in plan.neighbours(self.site) if n != source]
        if targets:
            down = self._with_hint(final)
            for t in targets:
                sent[t] = plan.plan_id
                self._send(out, t, down)
        if self._buffer:
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
        if self._outcome_due:
            self._send_due_outcomes(out)

    def _with_hint(self, final: RoundMsg) -> RoundMsg:
        """``final`` as this node sends it, with ``step`` = the fold hint: the first round of the layer this
        node has not gathered and whose own push has not arrived (rounds that have it finish within
        ``t_w``, too soon for a child's extra to make it)."""
        layer = final.layer
        i = self._newest_final.get(layer, -1) + 1
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
        c = self._carry.get(layer)
        if c is None or not c.ids:
            return
        for (_, lay), r in self._rounds.items():
            if lay == layer and not r.taken and not r.gathered:
                return
        target = max(self._hint.get(layer, -1), self._newest_final.get(layer, -1) + 1)
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
        payload, ids = c.payload, c.ids
        rest: SparsePayload | None = None
        if payload is not None and self.config.forward_policy == "per_site":
            cap = per_site_cap(
                payload.dense_len, payload.block_size, self.config.forward_density, len(plan.members)
            )
            payload, rest = top_blocks(payload, cap)
        self._carry[layer] = Carry(rest if rest is not None and rest.nnz_blocks else None)
        r.extras_out.append((payload, ids))
        self.stats.extras += 1
        self._send(out, parent, RoundMsg("extra", target, layer, plan.plan_id, payload, ids))
        if r.timer is None:
            self._advance(r, now, out)

    def _settle(
        self, r: OpenRound, counted: set[int] | None, since: int, now: float, out: list[Action]
    ) -> None:
        """Close ``r`` without a result: ``counted`` are this site's iterations a peer saw in results
        (``None``: unknown, the round is abandoned). Uncounted contributions are carried."""
        del self._rounds[(r.iteration, r.layer)]
        self._done.setdefault(r.layer, set()).add(r.iteration)
        if r.taken and r.own_ids:
            its = [it for _, it in r.own_ids]
            if counted is None:
                self.stats.abandoned += 1
                self._carry_add(r.layer, r.own, r.own_ids)
            elif not all(it in counted for it in its):
                if r.iteration < since:  # older than the peer's memory: maybe counted after all
                    self.stats.unresolved += 1
                self._carry_add(r.layer, r.own, r.own_ids)
        # extras sent ahead into this round are this site's contributions too: carried unless counted (a
        # site back from a long cut sends its carry ahead into a round that may end without a result)
        for p, ids in r.extras_out:
            if counted is None or not all(it in counted for _, it in ids):
                self._carry_add(r.layer, p, ids)
        if r.local is not None:
            self._carry_add(r.layer, r.local, ((self.site, r.iteration),))
        self.stats.settled += counted is not None
        out.append(
            RoundClosed(
                r.iteration, r.layer, (), r.plan.members, tuple(sorted(r.late)), now - r.first_opened, False
            )
        )
        if self._outcome_due:
            self._send_due_outcomes(out)

    # ------------------------------------------------------------------------------------------------
    # peer messages
    # ------------------------------------------------------------------------------------------------
    def _dispatch(self, peer: str, m: RoundMsg, now: float, out: list[Action]) -> None:
        key = (m.iteration, m.layer)
        if key in self._finals:
            self._answer_finished(peer, m, out)
            return
        if self._is_settled(m.iteration, m.layer):
            self.stats.stale_ignored += 1
            return
        if m.kind == "final":
            existing = self._rounds.get(key)
            if not self._may_finalize(peer, m.iteration, existing):
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
            self._hold(peer, m)
            return
        r = self._rounds.get(key) or self._open(m.iteration, m.layer, now, out)
        if m.kind == "partial":
            self._on_partial(peer, r, m, now, out)
        elif m.kind == "extra":
            self._on_extra(peer, r, m)
        elif m.kind == "segment":
            self._on_segment(peer, r, m, now, out)
        else:
            self._on_segment_final(peer, r, m, now, out)

    def _may_finalize(self, peer: str, iteration: int, r: OpenRound | None) -> bool:
        """Only this site's parent hands it a round's result (reliability: a peer holding the job secret
        may still send only what its place allows; another's is ignored, counted as foreign_finals): the
        parent in the plan of that iteration, or in the plan the open round was started under (a re-plan
        in between), the peer the round waits on, or a peer this site sent the round to (it answers a
        re-run with the result it already has)."""
        if self._timeline.plan_for(iteration).parent_of(self.site) == peer:
            return True
        return r is not None and (
            r.plan.parent_of(self.site) == peer or r.wait_peer == peer or peer in r.asked
        )

    def _answer_finished(self, peer: str, m: RoundMsg, out: list[Action]) -> None:
        key = (m.iteration, m.layer)
        final = self._finals[key]
        if m.kind in ("final", "segment_final"):
            if m.kind == "final" and m.sites != final.sites:
                self.stats.conflicts += 1
            else:
                self.stats.stale_ignored += 1
            return
        sent = self._final_sent[key]
        if sent.get(peer) != m.plan_id:  # it re-runs the round under a plan we did not answer yet
            sent[peer] = m.plan_id
            self.stats.final_replies += 1
            self._send(out, peer, self._with_hint(final))
        else:
            self.stats.late_inputs += 1

    def _answer_held(self, key: Key, out: list[Action]) -> None:
        """The round ``key`` just got its result here: whoever sent us messages for it under a plan we did
        not run (held for a re-plan that will now never come) is answered with the result, as a message
        arriving after the result would be (:meth:`_answer_finished`). Without this, after a partition
        between two sites (each dropped the other, the rest dropped neither) a site whose parent differs
        in its plan sent that parent its partial, the parent held it and finished the round under its own
        plan, and the site waited for the result forever with the parent's link up (the chaos soak's
        wedge after a short partition)."""
        for peer, q in list(self._buffer.items()):
            if not any((m.iteration, m.layer) == key for m in q):
                continue
            keep: deque[RoundMsg] = deque()
            for m in q:
                if (m.iteration, m.layer) == key:
                    self._answer_finished(peer, m, out)
                else:
                    keep.append(m)
            self._buffer[peer] = keep

    def _hold(self, peer: str, m: RoundMsg) -> None:
        q = self._buffer.get(peer)
        if q is None:
            q = self._buffer[peer] = deque()
        if len(q) >= self.config.max_buffered:
            q.popleft()
            self.stats.buffer_dropped += 1
        q.append(m)
        self.stats.buffered += 1

    def _on_partial(self, peer: str, r: OpenRound, m: RoundMsg, now: float, out: list[Action]) -> None:
        if r.plan.parent_of(peer) != self.site:
            raise RemoteProtocolError(
                "partial from a site that is not our child", peer=peer, value=r.plan.plan_id
            )
        if peer in r.inputs:
            raise RemoteProtocolError("duplicate partial", peer=peer, value=(m.iteration, m.layer))
        if r.gathered:
            r.late.add(peer)
            self.stats.late_inputs += 1  # proceeded without it; its originators carry it
            return
        r.inputs[peer] = m
        self._advance(r, now, out)

    def _on_extra(self, peer: str, r: OpenRound, m: RoundMsg) -> None:
        if r.plan.parent_of(peer) != self.site:
            raise RemoteProtocolError(
                "extra from a site that is not our child", peer=peer, value=r.plan.plan_id
            )
        if r.gathered:
            self.stats.late_inputs += 1  # too late again: its originator carries it on
            return
        have = r.extras_in.get(peer)
        if have is None:
            r.extras_in[peer] = (m.payload, m.sites)
        else:  # several carries aimed at one round: keep one merged entry per child (bounded state)
            r.extras_in[peer] = (
                aggregate([have[0], m.payload], peers=[peer, peer]),
                merge_ids(have[1], m.sites),
            )

    def _on_segment(self, peer: str, r: OpenRound, m: RoundMsg, now: float, out: list[Action]) -> None:
        if r.plan.all_pairs:
            k = self._pieces(r)
            check_allpairs_message(peer, r.plan, self.site, m, self._shapes.get(m.layer), k)
            take_part(peer, r, m, k)
        else:
            n, p = check_ring_message(peer, r.plan, self.site, m, self._shapes.get(m.layer))
            take_segment_step(peer, r, m, n, p)
        self._advance(r, now, out)

    def _on_segment_final(self, peer: str, r: OpenRound, m: RoundMsg, now: float, out: list[Action]) -> None:
        if r.plan.all_pairs:
            k = self._pieces(r)
            check_allpairs_message(peer, r.plan, self.site, m, self._shapes.get(m.layer), k)
            take_segment_final(peer, r, m, k)
        else:
            n, _ = check_ring_message(peer, r.plan, self.site, m, self._shapes.get(m.layer))
            for to, fwd in take_segment_result(peer, r, m, self.site, n):
                self._send(out, to, fwd)
            r.wait_since = now
        self._advance(r, now, out)

    def _ring_start(
        self,
        r: OpenRound,
        contrib: SparsePayload | None,
        ids: tuple[ContribId, ...],
        now: float,
        out: list[Action],
    ) -> None:
        if r.plan.all_pairs:
            shape = self._shapes.get(r.layer)
            direct = self.config.allpairs_direct
            k = self._pieces(r)
            sent = r.pre_sent if self._presending(r) else frozenset()
            starts = allpairs_start(r, self.site, contrib, ids, shape, direct=direct, pieces=k, sent=sent)
            for to, msg in starts:
                self._send(out, to, msg)
            r.wait_since, r.wait_reason = now, "ring"
            return
        to, msg = ring_start(r, self.site, contrib, ids, self._shapes.get(r.layer))
        self._send(out, to, msg)
        r.wait_peer, r.wait_since, r.wait_reason = r.plan.ring_prev(self.site), now, "ring"

    def _ring_progress(self, r: OpenRound, now: float, out: list[Action]) -> None:
        if r.plan.all_pairs:
            shape = self._shapes.get(r.layer)
            k = self._pieces(r)
            early = r.ring_slices is None  # a streamed push not whole yet (see local_piece)
            for to, msg in allpairs_reduce(r, self.site, shape, self._bound, self._narrow, k, early):
                self._send(out, to, msg)
            # wait on the first member still missing; a new wait (progress) restarts the suspect clock.
            # Not while this site's own streamed push is incomplete: the others may be waiting for it
            waiting = None if early else allpairs_waiting_on(r, self.site, k)
            if waiting != r.wait_peer:
                r.wait_peer, r.wait_since, r.suspected = waiting, now, False
        else:
            sends = ring_steps(r, self.site, self._shapes.get(r.layer), self._bound, self._narrow)
            for to, msg in sends:
                self._send(out, to, msg)
            if sends:
                r.wait_since = now
        if r.ring_slices is None:
            return  # the round closes only once this site's streamed push is whole and taken
        final = allpairs_result(r, self._pieces(r)) if r.plan.all_pairs else ring_result(r)
        if final is not None:
            self._close(r, self._narrow(final), None, now, out)

    def _pieces(self, r: OpenRound) -> int:
        """Pieces per all-pairs segment of ``r`` (cut-through, ``allpairs_chunk_bytes``); one under the
        ``cap`` policy, which bounds whole segments."""
        chunk = self.config.allpairs_chunk_bytes if self.config.forward_policy != "cap" else 0
        return piece_count(self._shapes.get(r.layer), len(r.plan.core), chunk)

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
        for key, final in self._finals.items():
            old = self._final_plan[key]
            new = self._timeline.plan_for(key[0])
            if new.plan_id == old.plan_id or new.core == old.core:
                continue
            # whoever finishes rounds changed: a site that has a result hands it to the new finishers, so
            # a round finished before the change is not finished a second time without it
            sent = self._final_sent[key]
            parent = new.parent_of(self.site)
            for t in [parent] if parent is not None else new.neighbours(self.site):
                if sent.get(t) != new.plan_id:
                    sent[t] = new.plan_id
                    self._send(out, t, self._with_hint(final))
            self._final_plan[key] = new
        held = self._buffer
        self._buffer = {}
        for peer, q in held.items():
            for m in q:
                try:
                    self._dispatch(peer, m, now, out)
                except RemoteProtocolError:
                    self.stats.buffer_dropped += 1
        for r in restarted:
            if (r.iteration, r.layer) in self._rounds:
                self._advance(r, now, out)
        for layer in [lay for lay, c in self._carry.items() if c.ids]:
            self._flush(layer, now, out)

    def _send_outcomes(self, peer: str, join_at: int, out: list[Action]) -> None:
        """Per layer, ``peer``'s contributions counted in results here before ``join_at``: the newest
        ``max_ids`` of them (a rejoining site needs the ones from just before it left; the bound every
        peer checks), and from which iteration on that list is complete (``step``)."""
        for layer in sorted(set(self._shapes) | self._counted.layers()):
            since, its = self._counted.counted(peer, layer, join_at, self._max_ids)
            ids = tuple((peer, it) for it in its)
            self._send(out, peer, RoundMsg("outcome", join_at, layer, 0, None, ids, since))

    def _send_due_outcomes(self, out: list[Action]) -> None:
        """Tell rejoined peers what was counted once it is known: an ``outcome`` speaks for every round
        before its join iteration, so it waits until this site finished its own (those that can finish:
        with a quorum). Sent at once, it said "not counted" for a round still in flight here whose result
        then counted it: the peer had carried that contribution already and it was counted twice (chaos
        soak, full run: a root killed with results not yet acknowledged, whose trainer re-sent them)."""
        for peer, join_at in list(self._outcome_due.items()):
            if peer not in self._timeline.live:
                del self._outcome_due[peer]
            elif not any(r.iteration < join_at and self._has_quorum(r.plan) for r in self._rounds.values()):
                del self._outcome_due[peer]
                self._send_outcomes(peer, join_at, out)

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
        # rounds this site finished just before it was cut off may have been re-run by the others without
        # it (its result never reached them): what they did not count is carried, so their record stays
        # exact; this site's trainers diverged and need the parameters from the others anyway
        for key in [k for k in self._final_own if k[1] == layer and k[0] < join_at]:
            for p, ids in self._final_own.pop(key):
                its = [it for _, it in ids]
                if key[0] >= since and not all(it in counted for it in its):
                    self.stats.diverged += 1
                    self._carry_add(layer, p, ids)
        self._done_below[layer] = max(self._done_below.get(layer, -1), join_at)
        self._flush(layer, now, out)

    def _prune(self, now: float, out: list[Action]) -> None:
        """Bound memory as the frontier advances: old rounds, results, ids and held messages go."""
        cfg = self.config
        floor = self._frontier - cfg.max_lag
        if floor <= self._floor:
            return
        for key in sorted(self._rounds):
            r = self._rounds.get(key)
            if r is not None and r.age_base < floor:
                self._settle(r, None, 0, now, out)
        keep_from = self._frontier - cfg.retain_finals
        for key in [k for k in self._finals if k[0] < keep_from]:
            del self._finals[key], self._final_plan[key], self._final_sent[key]
        for layer, its in self._done.items():
            if len(its) > 2 * cfg.max_lag:
                self._done[layer] = {i for i in its if i >= floor}
        own_floor = self._frontier - cfg.outcome_history
        if own_floor > self._own_since + cfg.outcome_history // 2:
            # own contributions in results outlive the results: a rejoin's outcome (sent once the peer
            # finished its rounds before the join) may come after the results themselves went. Only the
            # rounds finished just before this site was cut off matter, and its frontier stands still
            # while it is cut off, so a fixed number of iterations suffices (unlike the peers' record)
            for key in [k for k in self._final_own if k[0] < own_floor]:
                del self._final_own[key]
            self._own_since = own_floor
        for peer, q in list(self._buffer.items()):
            if q and q[0].iteration < floor:
                fresh = deque(m for m in q if m.iteration >= floor)
                self.stats.buffer_dropped += len(q) - len(fresh)
                self._buffer[peer] = fresh
        self._timeline.forget_before(floor)
        self._floor = floor

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"RoundEngine({self.site!r}, open={len(self._rounds)}, frontier={self._frontier})"
