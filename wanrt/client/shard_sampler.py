"""The trainer's side of dynamic data sharding (AntDT §IV-C): a sampler that leases shards of the dataset
from the job's shard service, yields their sample indices, and reports a shard DONE once the training step
that consumed its last sample is over.

Why leases and reports instead of a fixed partition: a fast site asks more often and so trains on more
data, a slow one on less (§IV-C2); a rank that dies loses only the shards it held, which go back to TODO
and are trained by whoever asks next (§IV-C3, at-least-once). A restarted rank starts a new sampler: its
first request says ``fresh``, so shards its earlier incarnation still held are re-queued at once, and it
continues with whatever the epoch has left, never from the start and never skipping.

Use it with a DataLoader (any iterable of indices is a sampler to PyTorch)::

    sampler = ctx.shards(len(dataset))            # or ShardSampler(link, len(dataset))
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    for epoch in range(epochs):
        for x, y in loader:
            loss_fn(model(x), y).backward()
            opt.step()
            sampler.step_done(len(x))             # samples this step consumed, in loader order

``step_done`` counts samples in the order the sampler yielded them (a DataLoader keeps that order, also
with workers and prefetching), so a shard is reported only when every one of its samples went through a
finished step. The report travels on the same link after that step's gradient pushes.

A pass over the loader is one epoch: it ends when the shard service has no TODO shard of the epoch left
(``drained``; the rest is in other ranks' hands) or the epoch is DONE (``finished``). Shards that come back
from a lost rank after that are handed to whoever asks next, before any shard of a later epoch (the grant
says which epoch they belong to), so no shard waits for a rank that is gone; the next epoch opens as soon
as this one has no TODO shard left, so a site never waits for the others' last shards (they would wait for
its gradients: the sites step together). A pass ends early only when
this rank holds ``max_outstanding`` shards still in flight (its batches reach across more shards than the
service lets it hold): the next pass then continues the same epoch. :attr:`epoch` is the next data epoch.

A step whose gradients were left out (its site's parameter snapshot was pending: ``discarded`` says so,
docs/kill_restart.md) trained nothing into the job, so a shard with samples in such a step is not
reported DONE on its strength: once consumed, it is trained again from this rank's lease (its samples are
yielded again before the next request) and reported after a step that counted. The shard service has no
"give back" message, and a shard left unreported would stay DOING while its holder keeps asking, so the
epoch could never be DONE; training it again keeps the at-least-once guarantee (AntDT §IV-C3) and the
cost is the few steps of a resync. Every rank of a site learns of a discarded step from the leader's
decision, so the ranks' stripes stay aligned.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final, Protocol

from wanrt.errors import ConfigError, WanrtError, WanrtTimeout
from wanrt.protocol.limits import MAX_SAMPLES, MAX_SHARDS_PER_MESSAGE
from wanrt.protocol.messages import ShardGrant

__all__ = ["GrantRelay", "ShardSampler", "ShardSource", "ShardsRefused"]

log = logging.getLogger(__name__)

#: Grants that do not answer this sampler's request (an earlier incarnation's, a replaced request) are
#: skipped; this many in a row means the link is confused.
_MAX_STRAY_GRANTS: Final = 64


@dataclass
class _Held:
    """A shard this rank is training: its samples are yields ``[begin, end)``; ``left_out``: some of them
    went through a step whose gradients were left out."""

    begin: int
    end: int
    epoch: int
    sid: int
    start: int
    stop: int
    left_out: bool = False


class ShardsRefused(ConfigError):
    """The shard service refused this sampler (another dataset size than the job's, too many shards)."""


class ShardSource(Protocol):
    """What the sampler needs from the site leader's link
    (:class:`~wanrt.client.link.gateway_link.GatewayLink` implements it)."""

    def request_shards(
        self, rank: int, request: int, epoch: int, dataset_len: int, want: int, fresh: bool
    ) -> None: ...

    def report_shards(self, rank: int, epoch: int, shards: tuple[int, ...]) -> None: ...

    def next_grant(self, timeout: float) -> ShardGrant | None: ...


class GrantRelay(Protocol):
    """Shares the leader's grants with the other ranks of its site
    (:class:`~wanrt.client.site.shard_grants.TorchGrantRelay`)."""

    def share(self, grant: ShardGrant | None) -> ShardGrant: ...


class ShardSampler:
    """See the module docstring.

    ``want``: shards asked at a time (more hides the request round trip, at the price of more shards
    re-trained if the rank dies). ``shuffle``: permute samples inside each shard (the service already
    orders shards by a seeded permutation), seeded by (``seed``, epoch, shard). ``retry_s``: how long to
    wait before asking again after ``wait``/``unavailable``; ``timeout_s``: how long one request may go
    unanswered before :class:`~wanrt.errors.WanrtTimeout`.

    A site of several ranks leases shards as one holder (the leader's link, lease rank ``rank``): pass
    ``stripe=(my rank, ranks)`` and a ``relay`` on every rank, ``source`` on the leader only (None
    elsewhere). Each rank trains every ``ranks``-th sample of each shard, padded by wrapping around so all
    stripes have the same length (as DistributedSampler pads), and the leader reports a shard once its own
    stripe went through a step, which, the site's ranks stepping together, means every stripe did.
    """

    def __init__(
        self,
        source: ShardSource | None,
        dataset_len: int,
        *,
        rank: int = 0,
        stripe: tuple[int, int] = (0, 1),
        relay: GrantRelay | None = None,
        epoch: int = 0,
        want: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        retry_s: float = 0.2,
        timeout_s: float = 60.0,
        discarded: Callable[[], bool] | None = None,
    ) -> None:
        if type(dataset_len) is not int or not 1 <= dataset_len <= MAX_SAMPLES:
            raise ConfigError("dataset_len must be a positive integer", key="dataset_len", value=dataset_len)
        if type(want) is not int or not 1 <= want <= MAX_SHARDS_PER_MESSAGE:
            raise ConfigError(f"want must be 1..{MAX_SHARDS_PER_MESSAGE}", key="want", value=want)
        if not 0.0 < retry_s <= 60.0 or not 0.0 < timeout_s <= 3600.0:
            raise ConfigError("retry_s and timeout_s must be positive", key="retry_s", value=retry_s)
        me, ranks = stripe
        if not 0 <= me < ranks or (ranks > 1 and relay is None) or ((source is None) != (me != 0)):
            raise ConfigError(
                "stripe=(rank, ranks) with 0 <= rank < ranks; a relay when ranks > 1; "
                "a source on rank 0 only",
                key="stripe",
                value=stripe,
            )
        self.source = source
        self.stripe = (me, ranks)
        self.relay = relay
        self.dataset_len = dataset_len
        self.rank = rank
        self.epoch = epoch
        self.want = want
        self.shuffle = shuffle
        self.seed = seed
        self.retry_s = retry_s
        self.timeout_s = timeout_s
        self._fresh = True
        self._request = 0
        self._yielded = 0  # samples handed out so far
        self._consumed = 0  # samples the training loop says it finished
        self._pending: deque[_Held] = deque()  # in yield order
        self._again: deque[_Held] = deque()  # consumed in a left-out step: to be trained again
        self._discarded = discarded
        #: shards trained again because a step that consumed some of their samples was left out
        self.retrained = 0
        self.granted = 0
        self.reported = 0
        #: the shard service's last answer: ``finished`` once the job has trained every epoch asked for
        self.last_status = ""

    # -- the training loop's side ----------------------------------------------------------------------

    def step_done(self, samples: int) -> None:
        """A training step finished (its gradients pushed) after consuming the next ``samples`` indices this
        sampler yielded: report every shard whose samples are all consumed now."""
        if type(samples) is not int or samples < 0:
            raise ConfigError("samples must be a non-negative integer", key="samples", value=samples)
        begin = self._consumed
        self._consumed = min(self._consumed + samples, self._yielded)
        if self._discarded is not None and self._consumed > begin and self._discarded():
            for held in self._pending:
                if held.begin >= self._consumed:
                    break
                if held.end > begin:
                    held.left_out = True
        self._report()

    def _report(self) -> None:
        by_epoch: dict[int, list[int]] = {}
        while self._pending and self._pending[0].end <= self._consumed:
            held = self._pending.popleft()
            if held.left_out:
                held.left_out = False
                self._again.append(held)
                self.retrained += 1
                continue
            by_epoch.setdefault(held.epoch, []).append(held.sid)
        if self.source is None:
            return  # a follower rank: the leader reports (its stripe is consumed at the same step)
        for epoch, ids in by_epoch.items():
            for i in range(0, len(ids), MAX_SHARDS_PER_MESSAGE):
                chunk = tuple(ids[i : i + MAX_SHARDS_PER_MESSAGE])
                self.source.report_shards(self.rank, epoch, chunk)
                self.reported += len(chunk)

    @property
    def in_flight(self) -> int:
        """Shards yielded (in part or whole) but not reported yet (also those to be trained again)."""
        return len(self._pending) + len(self._again)

    def set_epoch(self, epoch: int) -> None:
        """Start at data epoch ``epoch`` (a restarted rank resuming from its checkpoint)."""
        self.epoch = epoch

    # -- iteration ---------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[int]:
        while True:
            while self._again:  # shards whose samples went through a left-out step: trained again first
                held = self._again.popleft()
                yield from self._shard(held.epoch, held.sid, held.start, held.stop)
            grant = self._ask()
            self.last_status = grant.status
            if grant.status in ("finished", "drained"):
                if grant.epoch >= self.epoch:
                    self.epoch = grant.epoch + 1
                return
            if grant.status != "granted":  # wait / unavailable
                if self._pending:  # let the batches being built be trained and reported
                    log.warning(
                        "data epoch %d: this pass ends early (%s) with %d shards in flight; the next pass "
                        "continues the epoch (raise [scheduler.sharding] max_outstanding above the loader's "
                        "prefetch depth in shards)",
                        self.epoch,
                        grant.status,
                        len(self._pending),
                    )
                    return
                time.sleep(self.retry_s)
                continue
            for sid, start, stop in grant.shards:
                self.granted += 1
                yield from self._shard(grant.epoch, sid, start, stop)

    def _shard(self, epoch: int, sid: int, start: int, stop: int) -> Iterator[int]:
        """This rank's samples of one shard, in the order every incarnation and every retry uses."""
        order = list(range(start, stop))
        if self.shuffle:
            random.Random(f"{self.seed}:{epoch}:{sid}").shuffle(order)
        me, ranks = self.stripe
        if ranks > 1:
            per_rank = -(-len(order) // ranks)
            order = (order * 2)[: per_rank * ranks][me::ranks]  # padded by wrapping around
        begin = self._yielded
        self._pending.append(_Held(begin, begin + len(order), epoch, sid, start, stop))
        for index in order:
            self._yielded += 1
            yield index

    def _ask(self) -> ShardGrant:
        if self.source is None:  # a follower: the leader's answer, as it broadcasts it
            assert self.relay is not None
            grant = self.relay.share(None)
            if grant.status == "refused":
                raise ShardsRefused(
                    "the site leader's shard request failed (see its error)", key="dataset_len"
                )
            return grant
        try:
            grant = self._ask_service()
        except WanrtError:
            if self.relay is not None:  # the followers wait for this answer: tell them, then fail
                self.relay.share(ShardGrant(self.rank, self._request, self.epoch, "refused", ()))
            raise
        return grant if self.relay is None else self.relay.share(grant)

    def _ask_service(self) -> ShardGrant:
        assert self.source is not None
        self._request += 1
        request = self._request
        self.source.request_shards(self.rank, request, self.epoch, self.dataset_len, self.want, self._fresh)
        self._fresh = False
        deadline = time.monotonic() + self.timeout_s
        strays = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WanrtTimeout("the shard service did not answer", phase="shards", seconds=self.timeout_s)
            grant = self.source.next_grant(min(left, 1.0))
            if grant is None:
                continue
            if grant.request != request or grant.rank != self.rank:
                strays += 1
                if strays > _MAX_STRAY_GRANTS:
                    raise WanrtTimeout("shard grants keep answering other requests", phase="shards")
                continue
            if grant.status == "refused":
                raise ShardsRefused(
                    f"the shard service refused a dataset of {self.dataset_len} samples (another length "
                    "than the job's, or more shards than max_shards)",
                    key="dataset_len",
                    value=self.dataset_len,
                )
            return grant
