"""Settings of the job's data-shard service (table ``[scheduler.sharding]``), AntDT §IV-C.

* ``enabled`` — answer trainers' shard requests (off: every request is told ``unavailable``).
* ``shard_size`` — samples per shard. AntDT sets a shard to M = 100 batches (§V-A5); 100 batches of 32
  samples is the default. Smaller shards balance fast and slow sites more finely and lose less work to a
  crash, at the cost of more requests.
* ``lease_s`` — a DOING shard whose holder has not been heard of for this long goes back to TODO. Long enough
  for a slow rank to finish a shard (AntDT's monitor acts on 5-minute windows), since an expired lease makes
  the shard be computed twice.
* ``seed`` — the per-epoch shard order is a permutation drawn from (seed, epoch): every restart of the
  scheduler and every run with the same seed hands out shards in the same order.
* ``max_shards`` — bounds the state (one small record per shard) and the snapshot file.
* ``max_outstanding`` — shards one rank may hold at once (a rank cannot hoard the epoch).
* ``epochs`` — stop after this many epochs (0: unbounded).
* ``state_file`` — where the service's JSON snapshot is kept so progress survives a scheduler restart
  (unset: in memory only); rewritten at most every ``snapshot_interval_s``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from wanrt.config import check
from wanrt.protocol.limits import MAX_SAMPLES, MAX_SHARDS_PER_MESSAGE

__all__ = ["SECTION", "ShardingConfig"]

SECTION: Final = "scheduler.sharding"


@dataclass(frozen=True)
class ShardingConfig:
    """See the module docstring."""

    enabled: bool = True
    shard_size: int = 3200
    lease_s: float = 300.0
    seed: int = 0
    max_shards: int = 1 << 20
    max_outstanding: int = 4
    epochs: int = 0
    state_file: str | None = None
    snapshot_interval_s: float = 1.0

    def __post_init__(self) -> None:
        check(1 <= self.shard_size <= MAX_SAMPLES, "shard_size", self.shard_size, "1..2**40 samples")
        check(0.0 < self.lease_s <= 86_400.0, "lease_s", self.lease_s, "in (0, 86400] seconds")
        check(0 <= self.seed < 2**63, "seed", self.seed, "a non-negative 63-bit integer")
        check(1 <= self.max_shards <= 1 << 24, "max_shards", self.max_shards, "1..16777216")
        check(
            1 <= self.max_outstanding <= MAX_SHARDS_PER_MESSAGE,
            "max_outstanding",
            self.max_outstanding,
            f"1..{MAX_SHARDS_PER_MESSAGE}",
        )
        check(0 <= self.epochs <= 1 << 30, "epochs", self.epochs, "0 (unbounded) or a count")
        check(
            0.0 < self.snapshot_interval_s <= 3600.0,
            "snapshot_interval_s",
            self.snapshot_interval_s,
            "in (0, 3600] seconds",
        )
