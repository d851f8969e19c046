"""Where this site's own contributions are: the accounting that makes sure nothing is lost.

The invariant (:mod:`gateways.rounds.state`): every push from the local trainers is, at any moment, in
exactly one place — an open round (its ``local`` push, or its ``own`` contribution once taken, or an
``extra`` it sent ahead), the layer's carry, or the record of a result that counted it
(:class:`~gateways.rounds.finished.FinishedRounds`). This class moves contributions between those places
when the engine decides a round's fate: a round takes its own contribution (push plus carry, bounded per
``forward_policy``), a result counts some and not others (the rest is carried), a round ends without a
result (what no peer counted is carried), a rejoin's outcome says the others re-ran a round without them
(carried again), the carry goes ahead to the parent as an ``extra``. It also keeps the parent's fold hint
per layer (where the parent gathers next), which says where a carry sent ahead arrives in time.

The engine decides; this class keeps the books and counts in :class:`~gateways.rounds.state.EngineStats`.
Sans-IO.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateways.rounds.aggregate import aggregate
from gateways.rounds.finished import FinishedRounds, Owned
from gateways.rounds.forward_bound import ForwardBound
from gateways.rounds.state import Carry, EngineStats, OpenRound, merge_ids
from wanrt.payload import SparsePayload
from wanrt.protocol.peer.contrib_ids import id_pairs
from wanrt.protocol.peer.round_msg import ContribId, RoundMsg

__all__ = ["OwnLedger"]


class OwnLedger:
    """This site's (``site``) contributions not yet counted in a result: per-layer carries and moves."""

    def __init__(
        self,
        site: str,
        stats: EngineStats,
        forward: ForwardBound,
        finished: FinishedRounds,
        *,
        pass_dtype: bool,
    ) -> None:
        self.site = site
        self._stats = stats
        self._forward = forward
        self._finished = finished
        # with partial sums in the wire dtype, a contribution that is not summed with anything travels
        # in the dtype it came in (no widening to fp32 and narrowing back, which give the same bits)
        self._pass_dtype = pass_dtype
        self.carries: dict[int, Carry] = {}
        self.hints: dict[int, int] = {}  # layer -> where the parent gathers next (its last fold hint)

    def carry(self, layer: int) -> Carry | None:
        return self.carries.get(layer)

    def add(self, layer: int, payload: SparsePayload | None, ids: tuple[ContribId, ...]) -> None:
        """Carry ``payload`` (holding ``ids``; none: a residual) into a later round of ``layer``."""
        c = self.carries.get(layer)
        if c is None:
            c = self.carries[layer] = Carry()
        c.add(payload, ids)
        if ids:
            self._stats.carried += 1

    def owing_layers(self) -> list[int]:
        """Layers whose carry holds contributions (not only a residual)."""
        return [layer for layer, c in self.carries.items() if c.ids]

    def hint(self, layer: int) -> int:
        return self.hints.get(layer, -1)

    def note_hint(self, layer: int, step: int) -> None:
        """The parent's result said it gathers ``layer`` next at iteration ``step`` (or later)."""
        self.hints[layer] = max(self.hints.get(layer, -1), step)

    def take_own(self, r: OpenRound, presending: bool) -> None:
        """Fix this site's contribution to ``r``: its push plus the layer's carry (bounded per policy).
        ``presending``: slices of a streamed push already left, so the push alone is the contribution."""
        if r.taken:
            return
        carry = None if presending else self.carries.get(r.layer)
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
        own, kept = self._forward.cap_own(own, len(r.plan.members))
        r.pre_parts = []
        if carry is not None or r.layer not in self.carries:
            self.carries[r.layer] = Carry(kept)
        elif kept is not None:  # the carry was not folded (held back, or newer): it keeps the remainder too
            self.add(r.layer, kept, ())
        r.own, r.own_ids, r.taken, r.local = own, ids, True, None

    def closed(self, r: OpenRound, final: RoundMsg) -> None:
        """``final`` is the result of ``r`` here: what it counted of this site's goes on record, the rest
        (and a push that came too late for the round, and the round's bounding residual) is carried."""
        res = r.residuals.get(final.plan_id)
        if res is not None:
            self.add(r.layer, res, ())
        included = id_pairs(final.sites)
        counted: list[Owned] = []
        for p, ids in [(r.own, r.own_ids), *r.extras_out] if r.taken and r.own_ids else r.extras_out:
            hit = [x in included for x in ids]
            if all(hit):
                counted.append((p, ids))
            else:
                if any(hit):
                    self._stats.conflicts += 1
                self.add(r.layer, p, ids)
        if counted:
            self._finished.keep_own((r.iteration, r.layer), counted)
        if r.local is not None:
            self.add(r.layer, r.local, ((self.site, r.iteration),))

    def settled(self, r: OpenRound, counted: set[int] | None, since: int) -> None:
        """``r`` ended without a result: ``counted`` are this site's iterations a peer saw in results
        (``None``: unknown, the round is abandoned). Uncounted contributions are carried."""
        if r.taken and r.own_ids:
            its = [it for _, it in r.own_ids]
            if counted is None:
                self._stats.abandoned += 1
                self.add(r.layer, r.own, r.own_ids)
            elif not all(it in counted for it in its):
                if r.iteration < since:  # older than the peer's memory: maybe counted after all
                    self._stats.unresolved += 1
                self.add(r.layer, r.own, r.own_ids)
        # extras sent ahead into this round are this site's contributions too: carried unless counted (a
        # site back from a long cut sends its carry ahead into a round that may end without a result)
        for p, ids in r.extras_out:
            if counted is None or not all(it in counted for _, it in ids):
                self.add(r.layer, p, ids)
        if r.local is not None:
            self.add(r.layer, r.local, ((self.site, r.iteration),))

    def rejoined(self, layer: int, join_at: int, counted: set[int], since: int) -> None:
        """A peer's outcome for ``layer``: rounds this site finished just before it was cut off may have
        been re-run by the others without it (its result never reached them). What they did not count is
        carried, so their record stays exact; this site's trainers diverged and need the parameters from
        the others anyway."""
        for key, owned in self._finished.take_own_before(layer, join_at):
            for p, ids in owned:
                its = [it for _, it in ids]
                if key[0] >= since and not all(it in counted for it in its):
                    self._stats.diverged += 1
                    self.add(layer, p, ids)

    def send_ahead(self, layer: int, members: int) -> tuple[SparsePayload | None, tuple[ContribId, ...]]:
        """The carry of ``layer`` leaves as an ``extra`` in a plan of ``members`` sites: what goes (bounded
        per policy, with every id); the bounding remainder stays carried."""
        c = self.carries[layer]
        payload, rest = self._forward.cap_own(c.payload, members)
        self.carries[layer] = Carry(rest)
        self._stats.extras += 1
        return payload, c.ids

    def held(self, layer: int, rounds: Mapping[tuple[int, int], OpenRound]) -> list[Owned]:
        """Every piece of this site's mass of ``layer`` not yet in a final result: the carry (with the
        gateway residual) and the own contributions of the open ``rounds``."""
        out: list[Owned] = []
        c = self.carries.get(layer)
        if c is not None and not c.empty:
            out.append((c.payload, c.ids))
        for (_, lay), r in sorted(rounds.items()):
            if lay != layer:
                continue
            if r.taken and r.own_ids:
                out.append((r.own, r.own_ids))
            if r.local is not None:
                out.append((r.local, ((self.site, r.iteration),)))
            out.extend(r.extras_out)
        return out
