"""The shard-epochs model: the same kills lose shards with a stateless queue and none with the
ShardService; the even partition re-trains a killed rank's work and waits for its slowest rank."""

from __future__ import annotations

from sims.models.shard_epochs import EpochsConfig, run


def test_the_same_kills_lose_nothing_with_states_and_shards_without() -> None:
    c = EpochsConfig(samples=5_000, ranks=4, epochs=2, kills=3, seed=2)
    dds, queue, static = run(c, "dds"), run(c, "queue"), run(c, "static")
    assert dds.kills == queue.kills == static.kills == 3
    assert dds.lost == 0 and static.lost == 0 and queue.lost > 0
    assert 0 < dds.repeated <= 2 * dds.kills and dds.trained_twice == 0
    assert static.trained_twice > 0 and static.time_s > dds.time_s
    assert dds.samples_trained >= c.epochs * c.samples  # at least once, repeats on top


def test_without_kills_dynamic_shards_follow_each_rank_s_speed() -> None:
    c = EpochsConfig(samples=20_000, ranks=4, epochs=1, kills=0, heterogeneity=0.5, seed=1)
    dds = run(c, "dds")
    assert dds.lost == 0 and dds.repeated == 0 and dds.samples_trained == c.samples
    fast, slow = max(dds.shards_per_rank), min(dds.shards_per_rank)
    assert fast > 1.3 * slow  # §IV-C2: fast ranks fetch more shards
    assert run(c, "static").time_s > 1.2 * dds.time_s
