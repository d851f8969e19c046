"""Per-rank batch processing times in telemetry: what the leader writes, the gateway and scheduler read."""

from __future__ import annotations

import pytest

from wanrt.errors import LimitExceeded, RemoteProtocolError
from wanrt.rank_telemetry import MAX_REPORTED_RANKS, RANK_MEAN_KEY, parse_rank_times, rank_time_metrics


def test_round_trip_and_the_bound_keeps_the_slowest() -> None:
    times = [0.1 + 0.001 * r for r in range(40)]
    times[3] = 5.0
    m = rank_time_metrics(times)
    ranks = parse_rank_times(m, world_size=40)
    assert len(ranks) == MAX_REPORTED_RANKS and 3 in ranks and ranks[3] == 5.0
    assert set(ranks) == {3} | set(range(40 - (MAX_REPORTED_RANKS - 1), 40))
    assert m[RANK_MEAN_KEY] == pytest.approx(sum(times) / 40)
    prefixed = {f"trainer.{k}": v for k, v in m.items()}
    assert parse_rank_times(prefixed, prefix="trainer.", world_size=40) == ranks


@pytest.mark.parametrize(
    ("key", "value", "world"),
    [
        ("rank.2.compute_s", 0.1, 2),  # no such rank
        ("rank.x.compute_s", 0.1, None),
        ("rank.-1.compute_s", 0.1, None),
        ("rank.0.idle_s", 0.1, None),  # not a key of the protocol
        ("rank.0.compute_s", float("inf"), None),
        ("rank.0.compute_s", -1.0, None),
        ("rank.0.compute_s", 1e9, None),
    ],
)
def test_what_is_refused(key: str, value: float, world: int | None) -> None:
    with pytest.raises(RemoteProtocolError):
        parse_rank_times({key: value}, world_size=world, peer="trainer")


def test_too_many_ranks() -> None:
    m = {f"rank.{r}.compute_s": 0.1 for r in range(MAX_REPORTED_RANKS + 1)}
    with pytest.raises(LimitExceeded):
        parse_rank_times(m)
