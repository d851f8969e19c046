"""The rounds a gateway has settled: the results it holds, whom it sent them to, what they counted of its own
contributions, and which iterations of each layer need no round any more.

Why keep results at all. A result that exists always wins over a re-run (:mod:`gateways.rounds.engine`):
a peer that re-runs a round under a new plan — it lost a site, or a site rejoined — is answered with the
result this gateway already has, once per plan (``sent``), so a round is never finished twice with
different sums. Results are kept ``retain_finals`` iterations behind the frontier, the settled iterations
``2 · max_lag``, and this site's own contributions counted in results ``outcome_history`` iterations: a
rejoin's outcome may say the others re-ran such a round without them, and then they are carried again.
The engine decides what happens to a round; this class keeps the record and answers what it says.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gateways.rounds.config import RoundConfig
from gateways.rounds.state import EngineStats
from gateways.rounds.topology import Plan
from wanrt.payload import SparsePayload
from wanrt.protocol.peer.round_msg import ContribId, RoundMsg

__all__ = ["FinishedRounds", "Owned"]

Key = tuple[int, int]
#: a piece of this site's mass with the contributions it holds (``None``: an empty payload)
Owned = tuple[SparsePayload | None, tuple[ContribId, ...]]


class FinishedRounds:
    """Results and settled iterations at one gateway, bounded as the frontier advances (:meth:`prune`)."""

    def __init__(self, start_iteration: int, config: RoundConfig) -> None:
        self._config = config
        self.finals: dict[Key, RoundMsg] = {}
        self.plans: dict[Key, Plan] = {}  # the plan each result was made (or last offered) under
        self.sent: dict[Key, dict[str, int]] = {}  # peer -> plan id the result was sent to it under
        # own contributions counted in results here, kept as long as the results: if this site was cut off
        # right after finishing a round, the others re-ran it without them (RoundEngine._on_outcome)
        self.own: dict[Key, list[Owned]] = {}
        self._own_since = start_iteration  # ``own`` holds no key below this
        self._done: dict[int, set[int]] = {}  # layer -> settled iterations (>= the prune floor)
        self._done_below: dict[int, int] = {}  # layer -> every iteration below is settled (after rejoin)
        self.newest: dict[int, int] = {}  # layer -> newest iteration with a result here
        #: every iteration below is settled here (the engine raises it as its frontier advances)
        self.floor = start_iteration - config.max_lag

    def __contains__(self, key: Key) -> bool:
        return key in self.finals

    def is_settled(self, iteration: int, layer: int) -> bool:
        if (iteration, layer) in self.finals:
            return True
        if iteration < self._done_below.get(layer, -1) or iteration < self.floor:
            return True
        return iteration in self._done.get(layer, ())

    def newest_final(self, layer: int) -> int:
        return self.newest.get(layer, -1)

    def record(self, key: Key, final: RoundMsg, plan: Plan, source: str | None, site: str) -> Sequence[str]:
        """``final`` is the result of round ``key`` here, made here (``source`` None) or received from
        ``source``. Returns whom site ``site`` passes it on to, recorded as sent: its children in ``plan``
        if made here, else every neighbour but ``source``."""
        iteration, layer = key
        self.finals[key] = final
        self.plans[key] = plan
        sent = self.sent[key] = {}
        self.settle(iteration, layer)
        if iteration > self.newest.get(layer, -1):
            self.newest[layer] = iteration
        if source is None:
            targets: Sequence[str] = plan.children_of(site)
        else:
            sent[source] = final.plan_id
            targets = [n for n in plan.neighbours(site) if n != source]
        for t in targets:
            sent[t] = plan.plan_id
        return targets

    def offers(self, plan_for: Callable[[int], Plan], site: str) -> list[tuple[str, RoundMsg]]:
        """After a plan change: results to hand to the sites that now finish their rounds (``plan_for``
        the new plan of an iteration), once per plan. Whoever finishes rounds changed, so a site that has a
        result hands it to the new finishers, and a round finished before the change is not finished a
        second time without it."""
        out = []
        for key, final in self.finals.items():
            old, new = self.plans[key], plan_for(key[0])
            if new.plan_id == old.plan_id or new.core == old.core:
                continue
            sent = self.sent[key]
            parent = new.parent_of(site)
            for t in [parent] if parent is not None else new.neighbours(site):
                if sent.get(t) != new.plan_id:
                    sent[t] = new.plan_id
                    out.append((t, final))
            self.plans[key] = new
        return out

    def settle(self, iteration: int, layer: int) -> None:
        """Round ``(iteration, layer)`` ended here, with or without a result."""
        self._done.setdefault(layer, set()).add(iteration)

    def settle_below(self, layer: int, iteration: int) -> None:
        """Every round of ``layer`` below ``iteration`` is settled (a rejoin's outcome says so)."""
        self._done_below[layer] = max(self._done_below.get(layer, -1), iteration)

    def keep_own(self, key: Key, counted: list[Owned]) -> None:
        self.own[key] = counted

    def take_own_before(self, layer: int, iteration: int) -> list[tuple[Key, list[Owned]]]:
        """This site's contributions counted in results of ``layer`` below ``iteration``, removed."""
        return [(k, self.own.pop(k)) for k in [k for k in self.own if k[1] == layer and k[0] < iteration]]

    def reply(self, peer: str, m: RoundMsg, stats: EngineStats) -> RoundMsg | None:
        """What to answer ``m`` from ``peer`` for a round with a result here: the result, once per plan
        the peer re-runs it under (a final or a repeat is only counted)."""
        key = (m.iteration, m.layer)
        final = self.finals[key]
        if m.kind in ("final", "segment_final"):
            if m.kind == "final" and m.sites != final.sites:
                stats.conflicts += 1
            else:
                stats.stale_ignored += 1
            return None
        sent = self.sent[key]
        if sent.get(peer) != m.plan_id:  # it re-runs the round under a plan we did not answer yet
            sent[peer] = m.plan_id
            stats.final_replies += 1
            return final
        stats.late_inputs += 1
        return None

    def prune(self, frontier: int, floor: int) -> None:
        """Bound the record as the frontier advances (``floor``: the engine's new prune floor)."""
        cfg = self._config
        keep_from = frontier - cfg.retain_finals
        for key in [k for k in self.finals if k[0] < keep_from]:
            del self.finals[key], self.plans[key], self.sent[key]
        for layer, its in self._done.items():
            if len(its) > 2 * cfg.max_lag:
                self._done[layer] = {i for i in its if i >= floor}
        own_floor = frontier - cfg.outcome_history
        if own_floor > self._own_since + cfg.outcome_history // 2:
            # own contributions in results outlive the results: a rejoin's outcome (sent once the peer
            # finished its rounds before the join) may come after the results themselves went. Only the
            # rounds finished just before this site was cut off matter, and its frontier stands still
            # while it is cut off, so a fixed number of iterations suffices (unlike the peers' record)
            for key in [k for k in self.own if k[0] < own_floor]:
                del self.own[key]
            self._own_since = own_floor
