"""The leader's shard grants, shared with every rank of its site over torch.distributed.

Only the leader talks to the gateway, so in a site of W ranks the leader leases shards for the whole site
and every rank trains its own stripe of each (:class:`~wanrt.client.shard_sampler.ShardSampler`). All
ranks ask at the same points (their stripes have equal lengths, and they step together), so one broadcast
per request keeps them in lockstep: two broadcasts rooted at the site leader, a fixed header then the shard
list when it is not empty.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from wanrt.errors import LocalProtocolError, RemoteProtocolError
from wanrt.protocol.limits import MAX_SHARDS_PER_MESSAGE
from wanrt.protocol.messages import SHARD_STATUSES, ShardGrant

if TYPE_CHECKING:
    from wanrt.client.shard_sampler import ShardSampler

__all__ = ["TorchGrantRelay", "site_sampler"]

_HEADER = 5  # status, epoch, request, rank, number of shards


class TorchGrantRelay:
    """Broadcast a :class:`ShardGrant` from group rank 0 (the leader) to the site's other ranks."""

    def __init__(self, group: dist.ProcessGroup | None, device: torch.device) -> None:
        self._group = group
        self._device = device
        self._src = 0 if group is None else dist.get_global_rank(group, 0)

    def _bcast(self, t: torch.Tensor) -> torch.Tensor:
        t = t.to(self._device)
        dist.broadcast(t, src=self._src, group=self._group)
        return t.cpu()

    def share(self, grant: ShardGrant | None) -> ShardGrant:
        """The leader passes its grant (sent to the others, returned); the others pass None (received)."""
        if grant is not None:
            head = [
                SHARD_STATUSES.index(grant.status),
                grant.epoch,
                grant.request,
                grant.rank,
                len(grant.shards),
            ]
            self._bcast(torch.tensor(head, dtype=torch.int64))
            if grant.shards:
                self._bcast(torch.tensor([x for s in grant.shards for x in s], dtype=torch.int64))
            return grant
        head = self._bcast(torch.zeros(_HEADER, dtype=torch.int64)).tolist()
        status, epoch, request, rank, n = head
        if not 0 <= status < len(SHARD_STATUSES) or not 0 <= n <= MAX_SHARDS_PER_MESSAGE:
            raise RemoteProtocolError("the site leader broadcast a malformed shard grant", value=head)
        flat = self._bcast(torch.zeros(3 * n, dtype=torch.int64)).tolist() if n else []
        shards = tuple((flat[i], flat[i + 1], flat[i + 2]) for i in range(0, 3 * n, 3))
        return ShardGrant(rank, request, epoch, SHARD_STATUSES[status], shards)


def site_sampler(
    leader: bool,
    link: object | None,
    dataset_len: int,
    rank: int,
    world_size: int,
    group: dist.ProcessGroup | None,
    device: torch.device,
    options: dict[str, Any],
) -> ShardSampler:
    """The sampler behind ``ctx.shards()``: the leader leases through its gateway ``link``, the other ranks
    take the leader's grants over ``group`` (:class:`TorchGrantRelay`)."""
    from wanrt.client.shard_sampler import ShardSampler

    if link is not None and not all(
        hasattr(link, m) for m in ("request_shards", "report_shards", "next_grant")
    ):
        raise LocalProtocolError("this gateway link does not carry shard requests")
    relay = TorchGrantRelay(group, device) if world_size > 1 else None
    return ShardSampler(
        link if leader else None,  # type: ignore[arg-type]
        dataset_len,
        rank=0,
        stripe=(rank, world_size),
        relay=relay,
        **options,
    )
