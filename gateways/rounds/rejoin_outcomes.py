"""What a gateway tells a rejoining peer about its contributions: the ``outcome`` messages.

Why. A site cut off from the majority holds its contributions instead of training alone
(:mod:`gateways.rounds.engine`, "Why a quorum"); when it rejoins, it must learn which of them the others
counted in results while it was away, so it carries exactly the rest into its first rounds back. Every
gateway keeps, per peer and layer, the iterations of that peer counted in results here
(:class:`~gateways.rounds.counted_log.CountedLog`, as ranges, however long the peer was away), and sends
them once its own rounds before the peer's join iteration are finished: an outcome speaks for every round
before the join, so sent at once it said "not counted" for a round still in flight here whose result then
counted it, and the peer counted that contribution twice (chaos soak, full run: a root killed with results
not yet acknowledged, whose trainer re-sent them).

The engine decides when a round blocks an outcome and what a received outcome settles; this class keeps
the record and builds the messages. Sans-IO.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

from gateways.rounds.config import RoundConfig
from gateways.rounds.counted_log import CountedLog
from wanrt.protocol.peer.round_msg import ContribId, RoundMsg

__all__ = ["RejoinOutcomes"]


class RejoinOutcomes:
    """The peers' contributions counted here, and the outcomes owed to peers that rejoined."""

    def __init__(self, site: str, start_iteration: int, config: RoundConfig, max_ids: int) -> None:
        # every peer's contributions counted in results here, as ranges of iterations from the start on
        self.counted = CountedLog(start_iteration, config.outcome_ranges, skip=site)
        self._max_ids = max_ids
        self.due: dict[str, int] = {}  # peer -> join_at: its outcomes wait for our rounds before it

    def __bool__(self) -> bool:
        return bool(self.due)

    def count(self, layer: int, ids: Iterable[ContribId]) -> None:
        """A result of ``layer`` here counted ``ids``."""
        self.counted.add(layer, ids)

    def owe(self, peer: str, join_at: int) -> None:
        """``peer`` rejoined at ``join_at``: it gets its outcomes once they are known."""
        self.due[peer] = join_at

    def ready(self, live: Collection[str], blocked: Callable[[int], bool]) -> list[tuple[str, int]]:
        """The outcomes to send now, ``(peer, join_at)``: those whose rounds before ``join_at`` are not
        ``blocked`` any more (a peer lost meanwhile is owed nothing). Removed from what is owed."""
        out = []
        for peer, join_at in list(self.due.items()):
            if peer not in live:
                del self.due[peer]
            elif not blocked(join_at):
                del self.due[peer]
                out.append((peer, join_at))
        return out

    def messages(self, peer: str, join_at: int, layers: Iterable[int]) -> list[RoundMsg]:
        """Per layer, ``peer``'s contributions counted in results here before ``join_at``: the newest
        ``max_ids`` of them (a rejoining site needs the ones from just before it left; the bound every
        peer checks), and from which iteration on that list is complete (``step``)."""
        out = []
        for layer in sorted(set(layers) | self.counted.layers()):
            since, its = self.counted.counted(peer, layer, join_at, self._max_ids)
            ids = tuple((peer, it) for it in its)
            out.append(RoundMsg("outcome", join_at, layer, 0, None, ids, since))
        return out
