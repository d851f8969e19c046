"""What this gateway owes its site's trainer, so that nothing pushed or aggregated is lost across reconnects
and gateway restarts (sans-IO).

Pushes. The gateway acknowledges a trainer ``Push(iteration, layer)`` with ``Ack(iteration, layer, 0)`` once
the contribution ``(site, iteration)`` is *counted*: listed in a final result delivered here. Until then a
trainer that loses its gateway keeps the push and sends it again after reconnecting. A resent push is:

* already in the round engine (the trainer reconnected to a running gateway), or already settled as not
  counted and waiting to be folded: ignored, its ack follows (a trainer re-sends on every reconnect until
  acknowledged, so one push can come several times; folded twice, it would count twice);
* already counted: acknowledged again (the first ack was lost with the connection);
* older than the iteration this gateway joined the job at (the gateway was restarted and lost what it held):
  resolved with the ``outcome`` messages the other gateways send a rejoining site (which of its
  contributions their results counted). Counted → acknowledged; not counted → folded into the trainer's
  next push of the same layer, whose contribution then stands for both (the round engine's own rule for a
  contribution that missed its round), and both are acknowledged when that one is counted.

Aggregates. Each delivered result is kept until the trainer acknowledges it (the client does), and sent
again to a trainer that reconnects, bounded by :data:`MAX_RETAINED_AGGREGATES`. Every (iteration, layer)
the trainer pushed gets exactly one answer (:meth:`TrainerLedger.answer`): the aggregate, or an empty one
when the round ended here without a result, so a trainer never waits for a result that will not come.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from gateways.rounds.aggregate import aggregate
from gateways.rounds.counted_log import IterationRanges
from wanrt.errors import LimitExceeded, RemoteProtocolError
from wanrt.payload import SparsePayload
from wanrt.protocol.messages import Aggregate
from wanrt.protocol.peer.contrib_ids import iterations_of
from wanrt.protocol.peer.round_msg import ContribId

__all__ = ["MAX_RESENT_PER_LAYER", "MAX_RETAINED_AGGREGATES", "LedgerStats", "PushVerdict", "TrainerLedger"]

log = logging.getLogger(__name__)

#: Results kept for a trainer that has not acknowledged them. A trainer acknowledges each one as it reads
#: it, so only a disconnected trainer makes this grow: a few hundred iterations of a large model.
MAX_RETAINED_AGGREGATES: Final = 8192

#: Runs of counted (and of answered) iterations remembered per layer, to re-acknowledge a resent push and
#: to answer every pushed iteration once. Kept as ranges (gateways.rounds.counted_log.IterationRanges): a
#: run is a few ints however long, a gap comes from an outage. As sets of up to 8 192 iterations they were
#: what grew most in a long run (≈ 0.4 MB per layer and gateway by iteration 8 192; chaos soak RSS growth).
_COUNTED_RANGES: Final = 1024

#: Resent pushes from before a restart held per layer until an outcome settles them. A trainer resends what
#: it pushed but never saw acknowledged: a few iterations (its staleness bound), never thousands.
MAX_RESENT_PER_LAYER: Final = 256

Key = tuple[int, int]  # (iteration, layer)


@dataclass(frozen=True, slots=True)
class PushVerdict:
    """What to do with one trainer push: acknowledge ``acks`` now, hand ``push`` (iteration, layer,
    payload) to the round engine if set."""

    acks: tuple[Key, ...] = ()
    push: tuple[int, int, SparsePayload] | None = None


@dataclass(slots=True)
class LedgerStats:
    resent_ignored: int = 0
    reacked: int = 0
    recovered_counted: int = 0  # resent after a restart, already counted by the others
    recovered_folded: int = 0  # resent after a restart, not counted: folded into a later push
    unresolved: int = 0  # older than every outcome's history: folded, possibly counted twice
    conflicts: int = 0  # an outcome said "counted" after the push had been folded
    aggregates_evicted: int = 0


@dataclass(slots=True)
class _Layer:
    last_pushed: int = -1
    pending: dict[int, tuple[int, ...]] = field(default_factory=dict)  # engine iteration -> also covers
    counted: IterationRanges = field(default_factory=lambda: IterationRanges(-1, _COUNTED_RANGES))
    old: dict[int, SparsePayload] = field(default_factory=dict)  # resent, awaiting an outcome
    carry: list[tuple[int, SparsePayload]] = field(default_factory=list)  # resolved, not counted
    outcome: tuple[int, int] | None = None  # (since, join_at) covered by the outcomes so far
    # what the peers' outcomes said was counted, as ranges: a set gained an int per listed iteration on
    # every relink for the generation's life (chaos soak: ≈ 45 KB a layer over a full run)
    outcome_counted: IterationRanges = field(default_factory=lambda: IterationRanges(-1, _COUNTED_RANGES))
    folded: set[int] = field(default_factory=set)
    shape: tuple[int, int] | None = None  # (dense_len, block_size) of the trainer's pushes
    # iterations the trainer got a result for
    answered: IterationRanges = field(default_factory=lambda: IterationRanges(-1, _COUNTED_RANGES))


class TrainerLedger:
    """Bookkeeping of one site's trainer link; ``join_at`` is where this gateway's round engine starts."""

    def __init__(self, site: str, join_at: int) -> None:
        self.site = site
        self.join_at = join_at
        #: no gateway can tell which re-sent pushes were counted (the job resumed with every gateway
        #: restarted, gateways.service.state_file): they are taken as not counted and carried forward
        self.nobody_knows = False
        self._gave_up = False
        self._undecided: set[int] = set()  # layers holding a resent push no outcome reached back to yet
        self.stats = LedgerStats()
        self._layers: dict[int, _Layer] = {}
        self._aggregates: OrderedDict[Key, Aggregate] = OrderedDict()

    def _layer(self, layer: int) -> _Layer:
        st = self._layers.get(layer)
        if st is None:
            st = self._layers[layer] = _Layer()
        return st

    # -- pushes ---------------------------------------------------------------------------------------

    def on_push(self, iteration: int, layer: int, payload: SparsePayload) -> PushVerdict:
        st = self._layer(layer)
        st.shape = (payload.dense_len, payload.block_size)
        if iteration in st.counted:
            self.stats.reacked += 1
            return PushVerdict(acks=((iteration, layer),))
        seen = iteration in st.pending or iteration in st.old or iteration in st.folded
        if seen or _carried(st, iteration):
            # also one settled as not counted and waiting in the carry: the trainer sends a push again on
            # every reconnect until it is acknowledged, and carried twice it would be folded (counted) twice
            self.stats.resent_ignored += 1
            return PushVerdict()
        if iteration < self.join_at:
            if len(st.old) + len(st.carry) >= MAX_RESENT_PER_LAYER:
                raise LimitExceeded(
                    "too many resent pushes from before the gateway's restart",
                    name="MAX_RESENT_PER_LAYER",
                    limit=MAX_RESENT_PER_LAYER,
                    value=len(st.old) + len(st.carry) + 1,
                    peer="trainer",
                )
            st.old[iteration] = payload
            return PushVerdict(acks=self._resolve(layer, st))
        if iteration <= st.last_pushed:
            raise RemoteProtocolError(
                "pushes of a layer must come in increasing iterations", peer="trainer", value=iteration
            )
        covers = tuple(it for it, _ in st.carry)
        if st.carry:
            payload = _fold(payload, [p for _, p in st.carry])
            st.folded.update(covers)
            st.carry.clear()
        st.last_pushed = iteration
        st.pending[iteration] = covers
        return PushVerdict(push=(iteration, layer, payload))

    def next_push(self) -> int:
        """The first iteration no layer was pushed for (``join_at`` before any push): where a replacement
        trainer may start (its pushes must keep increasing per layer)."""
        last = max((st.last_pushed for st in self._layers.values()), default=-1)
        return max(last + 1, self.join_at)

    def pushed_layers(self) -> dict[int, tuple[int, tuple[int, int] | None]]:
        """Per layer pushed so far: (last iteration pushed, (dense_len, block_size)) — where empty pushes
        for a dead trainer continue (gateways.node.trainer_runs)."""
        return {
            layer: (max(st.last_pushed, self.join_at - 1), st.shape) for layer, st in self._layers.items()
        }

    def covers(self, iteration: int, layer: int) -> tuple[int, ...]:
        """The earlier pushes of ``layer`` folded into the push of ``iteration`` (resent pushes no peer
        had counted: they count under that push's id; the chaos soak's accounting follows them)."""
        st = self._layers.get(layer)
        return () if st is None else st.pending.get(iteration, ())

    def forget_aggregates(self) -> None:
        """Drop the results kept for a trainer run that died: its restart gets the job's parameters by a
        resync instead, and starts after every one of them."""
        self._aggregates.clear()

    def fresh(self, iteration: int, layer: int) -> bool:
        """Would :meth:`on_push` hand this push to the round engine unchanged (a new iteration, nothing
        to fold into it)? Only then may pieces of a streamed push go ahead of it
        (:mod:`gateways.node.push_stream`)."""
        st = self._layers.get(layer)
        if st is None:
            return iteration >= self.join_at
        return (
            iteration >= self.join_at
            and iteration > st.last_pushed
            and not st.carry
            and iteration not in st.counted
            and iteration not in st.old
        )

    def on_outcome(self, layer: int, since: int, join_at: int, ids: Sequence[ContribId]) -> tuple[Key, ...]:
        """A peer's ``outcome`` for ``layer``: our contributions its results counted in [since, join_at)."""
        st = self._layer(layer)
        counted = {it for s, it in ids if s == self.site}
        late = counted & st.folded
        if late:
            self.stats.conflicts += len(late)
            log.warning(
                "layer %d: iterations %s were folded into later pushes before a peer reported them counted",
                layer,
                sorted(late),
            )
        for it in sorted(counted):
            st.outcome_counted.add(it)
        lo, hi = (
            (since, join_at)
            if st.outcome is None
            else (min(since, st.outcome[0]), max(join_at, st.outcome[1]))
        )
        st.outcome = (lo, hi)
        return self._resolve(layer, st)

    def _resolve(self, layer: int, st: _Layer, *, final: bool = False) -> tuple[Key, ...]:
        """Settle the resent pushes the outcomes so far speak for. One older than every outcome so far
        (``since``) waits for the next peer's outcome, which may reach further back (the first outcome
        often comes from a peer restarted after that push: its record starts at its own restart), until
        :meth:`give_up` (``final``): then it is carried, possibly counted twice (``unresolved``). Settled on
        the first outcome, such pushes were counted twice in the chaos soak (full seed 2)."""
        if st.outcome is None and not self.nobody_knows:
            return ()
        since = st.outcome[0] if st.outcome is not None else -1
        acks: list[Key] = []
        for it in sorted(st.old):
            if it in st.outcome_counted:
                st.old.pop(it)
                self.stats.recovered_counted += 1
                self._count(st, it)
                acks.append((it, layer))
            elif it >= since or self.nobody_knows or final or self._gave_up:
                payload = st.old.pop(it)
                if it < since:
                    self.stats.unresolved += 1
                self.stats.recovered_folded += 1
                st.carry.append((it, payload))
        if st.old and st.outcome is not None:
            self._undecided.add(layer)
        else:
            self._undecided.discard(layer)
        return tuple(acks)

    def undecided(self) -> bool:
        """Some resent push waits for an outcome that reaches back to it (see :meth:`give_up`)."""
        return bool(self._undecided)

    def give_up(self) -> tuple[Key, ...]:
        """No further outcome is coming (the peers that would send one had the time to link): the resent
        pushes no outcome spoke for are carried into the trainer's next pushes (at least once)."""
        self._gave_up = True  # a push resent later is settled by the outcomes there are
        acks: list[Key] = []
        for layer in sorted(self._undecided):
            acks.extend(self._resolve(layer, self._layers[layer], final=True))
        return tuple(acks)

    def on_deliver(self, layer: int, ids: Sequence[ContribId]) -> tuple[Key, ...]:
        """A final result of ``layer`` with contribution ``ids`` (canonical order: sorted, as every result's
        ids are) was delivered: the pushes to acknowledge."""
        st = self._layers.get(layer)
        if st is None:
            return ()
        acks: list[Key] = []
        for it in iterations_of(ids, self.site):  # ids are canonical: a binary search, not a scan of N
            covers = st.pending.pop(it, None)
            if covers is None:
                continue
            for old in (it, *covers):
                st.folded.discard(old)
                self._count(st, old)
                acks.append((old, layer))
        return tuple(acks)

    def _count(self, st: _Layer, iteration: int) -> None:
        st.counted.add(iteration)

    def shape(self, layer: int) -> tuple[int, int] | None:
        """(dense_len, block_size) of the layer as the trainer pushes it, if it did."""
        st = self._layers.get(layer)
        return None if st is None else st.shape

    def held(self, layer: int) -> list[tuple[int, SparsePayload]]:
        """Resent pushes not yet in the round engine (awaiting an outcome or a later push to fold into)."""
        st = self._layers.get(layer)
        if st is None:
            return []
        return sorted([*st.old.items(), *st.carry], key=lambda x: x[0])

    # -- aggregates -----------------------------------------------------------------------------------

    def answer(self, iteration: int, layer: int) -> bool:
        """Record that the trainer gets a result for (iteration, layer); False if it already got one."""
        return self._layer(layer).answered.add(iteration)

    def retain(self, msg: Aggregate) -> None:
        key = (msg.iteration, msg.layer)
        self._aggregates[key] = msg
        self._aggregates.move_to_end(key)
        while len(self._aggregates) > MAX_RETAINED_AGGREGATES:
            old, _ = self._aggregates.popitem(last=False)
            self.stats.aggregates_evicted += 1
            log.warning("trainer has not acknowledged the aggregate of %s; no longer kept for it", old)

    def aggregate_acked(self, iteration: int, layer: int) -> bool:
        return self._aggregates.pop((iteration, layer), None) is not None

    def unacked_aggregates(self) -> list[Aggregate]:
        """Results to send again to a trainer that (re)connects, oldest first."""
        return list(self._aggregates.values())


def _carried(st: _Layer, iteration: int) -> bool:
    """``iteration`` waits in the layer's carry (at most MAX_RESENT_PER_LAYER entries)."""
    return any(it == iteration for it, _ in st.carry)


def _fold(payload: SparsePayload, extra: list[SparsePayload]) -> SparsePayload:
    out = aggregate([payload, *extra])
    assert out is not None  # aggregate of at least one payload
    return out
