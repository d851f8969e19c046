"""What a gateway does with its trainer's data-shard traffic (AntDT §IV-C): relay and check, decide nothing.

The shard table lives in the scheduler (:mod:`scheduler.sharding`). The gateway stamps its own site on what
its trainer asks or reports (so a trainer can never speak for another site, and the scheduler refuses a
gateway that does), hands the scheduler's grants back, and says when its trainer left so the shards that
trainer held go back to TODO at once instead of after their lease.

While the scheduler is away, a request is answered ``unavailable`` at once (the trainer asks again later)
and DONE reports (and the news that the trainer left) wait in a bounded backlog, sent in order when the
link is back: a report lost here would make the shard be trained again after the restart (never lost, but
repeated).
"""

from __future__ import annotations

from collections import deque
from typing import Final

from wanrt.errors import RemoteProtocolError
from wanrt.protocol import Message, ShardDone, ShardGrant, ShardRequest
from wanrt.protocol.scheduler.messages import (
    SiteShardDone,
    SiteShardGrant,
    SiteShardRelease,
    SiteShardRequest,
)

__all__ = ["MAX_DONE_BACKLOG", "ShardRelay"]

#: DONE reports kept while the scheduler is away: a rank holds at most 64 shards, so this covers many
#: ranks' worth; beyond it the oldest are dropped (those shards are re-trained, never lost).
MAX_DONE_BACKLOG: Final = 1024


class ShardRelay:
    """See the module docstring. Each call returns ``(to_scheduler, to_trainer)`` messages."""

    def __init__(self, site: str) -> None:
        self.site = site
        self._backlog: deque[SiteShardDone | SiteShardRelease] = deque(maxlen=MAX_DONE_BACKLOG)
        self.relayed = 0

    def from_trainer(
        self, msg: ShardRequest | ShardDone, scheduler_up: bool
    ) -> tuple[list[Message], list[Message]]:
        self.relayed += 1
        if isinstance(msg, ShardRequest):
            if not scheduler_up:
                return [], [ShardGrant(msg.rank, msg.request, msg.epoch, "unavailable", ())]
            req = SiteShardRequest(
                self.site, msg.rank, msg.request, msg.epoch, msg.dataset_len, msg.want, msg.fresh
            )
            return [req], []
        done = SiteShardDone(self.site, msg.rank, msg.epoch, msg.shards)
        if not scheduler_up:
            self._backlog.append(done)
            return [], []
        return [done], []

    def from_scheduler(
        self, grant: SiteShardGrant, trainer_here: bool
    ) -> tuple[list[Message], list[Message]]:
        """A grant for this site. With no trainer to take it, its shards go straight back (release)."""
        if grant.site != self.site:
            raise RemoteProtocolError("a shard grant for another site", peer="scheduler", value=grant.site)
        if not trainer_here:
            if grant.shards:
                return [SiteShardRelease(self.site, "the trainer left before its grant arrived")], []
            return [], []
        return [], [ShardGrant(grant.rank, grant.request, grant.epoch, grant.status, grant.shards)]

    def trainer_left(self, reason: str, scheduler_up: bool) -> list[Message]:
        release = SiteShardRelease(self.site, reason[:200])
        if not scheduler_up:  # said once the link is back, after the reports before it
            self._backlog.append(release)
            return []
        return [release]

    def scheduler_up(self) -> list[Message]:
        out: list[Message] = list(self._backlog)
        self._backlog.clear()
        return out
