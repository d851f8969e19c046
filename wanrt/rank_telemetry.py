"""Per-rank batch processing times in a site's telemetry: ``rank.<r>.compute_s``.

AntDT's Monitor (§VI-A2) needs every worker's batch processing time (BPT) to tell a straggler *rank* from
a straggler *site*: the site leader gathers its ranks' compute times each iteration and reports them as
``rank.<r>.compute_s`` beside its own aggregate keys; the gateway checks them and forwards them as
``trainer.rank.<r>.compute_s``; the scheduler's :class:`~scheduler.stragglers.rank_restart.RankRestarts`
reads them. One parser for all three, so what the client writes is exactly what the others accept.

A report's keys are bounded (:data:`wanrt.protocol.limits.MAX_TELEMETRY_KEYS` for the whole report, of which
the gateway's own links take most), so at most :data:`MAX_REPORTED_RANKS` ranks go in one report: the
slowest ones (a straggler is what the scheduler looks for); a bigger site's other ranks are summarised by
``ranks.mean_compute_s`` over every rank.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Final

from wanrt.errors import LimitExceeded, RemoteProtocolError
from wanrt.protocol.limits import MAX_RANK

__all__ = [
    "MAX_REPORTED_RANKS",
    "RANK_KEY_PREFIX",
    "RANK_MEAN_KEY",
    "parse_rank_times",
    "rank_time_metrics",
]

#: Ranks per report: a gateway's report holds ≤ 256 keys, its 24 busiest links up to 8 each (the gateway
#: drops the fastest ranks' keys first if a report would still overflow).
MAX_REPORTED_RANKS: Final = 16
RANK_KEY_PREFIX: Final = "rank."
_SUFFIX: Final = ".compute_s"
RANK_MEAN_KEY: Final = "ranks.mean_compute_s"
#: A batch processing time beyond a day is a broken clock, not a straggler.
MAX_COMPUTE_S: Final = 86_400.0


def rank_time_metrics(times: Sequence[float]) -> dict[str, float]:
    """The keys for one iteration's per-rank compute times (index = rank): the slowest
    :data:`MAX_REPORTED_RANKS` ranks, and the mean over all of them."""
    if not times:
        return {}
    order = sorted(range(len(times)), key=lambda r: (-times[r], r))[:MAX_REPORTED_RANKS]
    out = {f"{RANK_KEY_PREFIX}{r}{_SUFFIX}": float(max(0.0, times[r])) for r in sorted(order)}
    out[RANK_MEAN_KEY] = float(sum(max(0.0, t) for t in times) / len(times))
    return out


def parse_rank_times(
    metrics: Mapping[str, float], *, prefix: str = "", world_size: int | None = None, peer: str | None = None
) -> dict[int, float]:
    """``{rank: compute_s}`` from a report's ``<prefix>rank.<r>.compute_s`` keys.

    RemoteProtocolError (LimitExceeded) when a key names a rank that cannot be (not a decimal integer,
    outside ``[0, world_size)`` or ``[0, MAX_RANK)``), a time is not finite or outside ``[0, 1 day]``, or more
    than :data:`MAX_REPORTED_RANKS` ranks are reported: whoever sent it does not follow the protocol.
    """
    head = prefix + RANK_KEY_PREFIX
    out: dict[int, float] = {}
    limit = MAX_RANK if world_size is None else min(MAX_RANK, world_size)
    for key, value in metrics.items():
        if not key.startswith(head):
            continue
        middle = key[len(head) :]
        if not middle.endswith(_SUFFIX):
            raise RemoteProtocolError("unknown per-rank telemetry key", peer=peer, value=key[:80])
        digits = middle[: -len(_SUFFIX)]
        if not (digits.isascii() and digits.isdigit() and len(digits) <= 6):
            raise RemoteProtocolError("per-rank telemetry names no rank", peer=peer, value=key[:80])
        rank = int(digits)
        if not 0 <= rank < limit:
            raise RemoteProtocolError(
                f"per-rank telemetry names rank {rank}, outside [0, {limit})", peer=peer, value=rank
            )
        v = float(value)
        if not (math.isfinite(v) and 0.0 <= v <= MAX_COMPUTE_S):
            raise RemoteProtocolError("per-rank compute time out of range", peer=peer, value=v)
        out[rank] = v
        if len(out) > MAX_REPORTED_RANKS:
            raise LimitExceeded(
                "too many per-rank telemetry keys",
                name="MAX_REPORTED_RANKS",
                limit=MAX_REPORTED_RANKS,
                value=len(out),
                peer=peer,
            )
    return out
