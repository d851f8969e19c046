"""What the scheduler and the gateways say to each other (protocol codes in the scheduler range 0x40–0x7F).

A decision reaches every site in two phases, so that every site switches at the same iteration (AntDT:
"global actions applied by all nodes at the same iteration"; StellaTrain §4.1 applies a new (r, x) to all
GPUs at once):

1. ``Announce(phase="prepare")`` with the decision's id, its effective iteration and its values. A gateway
   answers ``AnnounceReply(accepted=True)`` if its trainers cannot have reached that iteration yet, else
   ``accepted=False`` with its frontier; nothing reaches its trainers yet.
2. Once every connected gateway accepted, ``Announce(phase="commit")``: each gateway forwards the values to
   its trainers as a ``ConfigUpdate`` for that iteration. Had one refused, ``Announce(phase="abort")`` and
   the scheduler prepares again further ahead, under a new id.

Data shards (AntDT §IV-C, :mod:`scheduler.sharding`) travel as four more messages. A trainer's core
``ShardRequest`` / ``ShardDone`` reach its gateway, which relays them as :class:`SiteShardRequest` /
:class:`SiteShardDone` naming its own site (the scheduler refuses a gateway speaking for another); the
scheduler answers :class:`SiteShardGrant`, relayed to the trainer as a core ``ShardGrant``. When its trainer
disconnects, the gateway sends :class:`SiteShardRelease`, so the shards that trainer held go back to TODO.

Gateways report with the core ``Telemetry`` message (their frontier, the decision they run, link and
trainer measurements), which is also how a restarted scheduler learns the job's state back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from wanrt.errors import ConfigError, LocalProtocolError
from wanrt.live_settings import RESTART_KEY, check_live_settings
from wanrt.protocol import CORE_REGISTRY, Message
from wanrt.protocol.checks import check_name, check_scalar_map, check_text, check_uint
from wanrt.protocol.limits import MAX_CONFIG_KEYS, MAX_COUNTER, MAX_RANK
from wanrt.protocol.messages import (
    check_shard_grant,
    check_shard_ids,
    check_shard_request,
)

__all__ = [
    "PHASES",
    "RESTART_PREFIX",
    "SCHEDULER_REGISTRY",
    "SITE_BATCH_PREFIX",
    "SITE_LOCAL_STEPS_PREFIX",
    "SITE_WEIGHT_PREFIX",
    "Announce",
    "AnnounceReply",
    "SiteShardDone",
    "SiteShardGrant",
    "SiteShardRelease",
    "SiteShardRequest",
    "check_site_keys",
    "site_values",
]

PHASES: Final = ("prepare", "commit", "abort")

#: A per-site batch size in a decision's values: ``batch_size@<site>`` = per-rank batch at that site.
SITE_BATCH_PREFIX: Final = "batch_size@"
#: A per-site gradient weight: ``batch_weight@<site>`` = the site's share of the samples × the site count.
SITE_WEIGHT_PREFIX: Final = "batch_weight@"
#: Local micro-steps per WAN iteration at a site (ElasticBSP's iterations per barrier, chosen by ZipLine):
#: ``local_steps@<site>`` = k, the site accumulates k micro-steps' gradients and pushes once.
SITE_LOCAL_STEPS_PREFIX: Final = "local_steps@"
#: A KILL_RESTART order (AntDT §V-E3): ``restart@<site>`` = the rank of that site to restart. One-shot: it
#: belongs to the one decision that orders it and is never carried into the next (SchedulerNode), and only the
#: scheduler's policy may put it in a decision (``POST /config`` refuses it).
RESTART_PREFIX: Final = "restart@"
_PER_SITE: Final = {
    SITE_BATCH_PREFIX: "batch_size",
    SITE_WEIGHT_PREFIX: "batch_weight",
    SITE_LOCAL_STEPS_PREFIX: "local_steps",
    RESTART_PREFIX: RESTART_KEY,
}


def site_values(values: Mapping[str, Any], site: str) -> dict[str, Any]:
    """A decision's values as site ``site``'s trainers take them: its own ``batch_size@<site>``,
    ``batch_weight@<site>``, ``local_steps@<site>`` and ``restart@<site>`` become ``batch_size``,
    ``batch_weight``, ``local_steps`` and ``restart``, the other sites' are dropped."""
    out = {k: v for k, v in values.items() if "@" not in k and k != RESTART_KEY}  # a restart names its site
    for prefix, key in _PER_SITE.items():
        own = values.get(prefix + site)
        if own is not None:
            out[key] = own
    return out


def check_site_keys(values: Mapping[str, Any]) -> None:
    """ConfigError for a ``<key>@<site>`` whose key has no per-site form: :func:`site_values` would drop
    it without a word, so a manual ``lr_scale@a`` (job-wide: :data:`wanrt.live_settings.JOB_WIDE_KEYS`)
    or ``density@a`` would be accepted and never applied anywhere."""
    for key, value in values.items():
        name, at, _ = key.partition("@")
        if at and name + at not in _PER_SITE:
            check_live_settings({key: value})  # a job-wide key's own message (it raises for any key@site)
            raise ConfigError(f"{key}: {name} has no per-site form", key=key, value=value)


@dataclass(frozen=True, slots=True)
class Announce(Message):
    """Scheduler → gateway: one phase of decision ``decision`` (see the module docstring)."""

    TYPE: ClassVar[int] = 0x40
    STREAM: ClassVar[bool] = True
    decision: int
    phase: str
    effective_iteration: int
    values: dict[str, Any]

    def __post_init__(self) -> None:
        check_uint(self.decision, "decision", MAX_COUNTER)
        if self.phase not in PHASES:
            raise LocalProtocolError("unknown announce phase", value=str(self.phase)[:32])
        check_uint(self.effective_iteration, "effective_iteration", MAX_COUNTER)
        object.__setattr__(
            self, "values", check_scalar_map(self.values, "values", "MAX_CONFIG_KEYS", MAX_CONFIG_KEYS)
        )


@dataclass(frozen=True, slots=True)
class AnnounceReply(Message):
    """Gateway → scheduler: whether decision ``decision`` can still take effect where it says.
    ``problem`` (refused only): the values cannot apply at this gateway (a plan naming an unknown site);
    empty when it is only too late, which a prepare further ahead fixes."""

    TYPE: ClassVar[int] = 0x41
    STREAM: ClassVar[bool] = True
    decision: int
    accepted: bool
    frontier: int
    problem: str = ""

    def __post_init__(self) -> None:
        check_uint(self.decision, "decision", MAX_COUNTER)
        if type(self.accepted) is not bool:
            raise LocalProtocolError("accepted must be true or false")
        if type(self.frontier) is not int or not -1 <= self.frontier <= MAX_COUNTER:
            raise LocalProtocolError("frontier out of range", value=self.frontier)
        check_text(self.problem, "problem")


@dataclass(frozen=True, slots=True)
class SiteShardRequest(Message):
    """Gateway → scheduler: site ``site``'s rank ``rank`` asks for shards (a relayed core ShardRequest)."""

    TYPE: ClassVar[int] = 0x42
    STREAM: ClassVar[bool] = True
    site: str
    rank: int
    request: int
    epoch: int
    dataset_len: int
    want: int
    fresh: bool

    def __post_init__(self) -> None:
        check_name(self.site, "site")
        check_shard_request(self.rank, self.request, self.epoch, self.dataset_len, self.want, self.fresh)


@dataclass(frozen=True, slots=True)
class SiteShardGrant(Message):
    """Scheduler → gateway: the answer to ``SiteShardRequest`` ``request`` of ``site``'s rank ``rank``."""

    TYPE: ClassVar[int] = 0x43
    STREAM: ClassVar[bool] = True
    site: str
    rank: int
    request: int
    epoch: int
    status: str
    shards: tuple[tuple[int, int, int], ...]

    def __post_init__(self) -> None:
        check_name(self.site, "site")
        shards = check_shard_grant(self.rank, self.request, self.epoch, self.status, self.shards)
        object.__setattr__(self, "shards", shards)


@dataclass(frozen=True, slots=True)
class SiteShardDone(Message):
    """Gateway → scheduler: ``site``'s rank ``rank`` finished these shards of ``epoch``."""

    TYPE: ClassVar[int] = 0x44
    STREAM: ClassVar[bool] = True
    site: str
    rank: int
    epoch: int
    shards: tuple[int, ...]

    def __post_init__(self) -> None:
        check_name(self.site, "site")
        check_uint(self.rank, "rank", MAX_RANK)
        check_uint(self.epoch, "epoch", MAX_COUNTER)
        object.__setattr__(self, "shards", check_shard_ids(self.shards))


@dataclass(frozen=True, slots=True)
class SiteShardRelease(Message):
    """Gateway → scheduler: ``site``'s trainer left (``reason``): every shard its ranks hold goes back to
    TODO (AntDT: a lost worker's DOING shards are re-queued at the end)."""

    TYPE: ClassVar[int] = 0x45
    STREAM: ClassVar[bool] = True
    site: str
    reason: str

    def __post_init__(self) -> None:
        check_name(self.site, "site")
        check_text(self.reason, "reason", 200)


#: The protocol spoken on a gateway's link to the scheduler.
SCHEDULER_REGISTRY: Final = CORE_REGISTRY.with_messages(
    Announce, AnnounceReply, SiteShardRequest, SiteShardGrant, SiteShardDone, SiteShardRelease
)
