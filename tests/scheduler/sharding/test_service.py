"""The shard service: every shard of an epoch ends DONE at least once under any sequence of grants,
reports, disconnects, fresh restarts and lease expiries; repeats are counted; state survives a snapshot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.sharding import ShardingConfig, ShardService, read_state, write_state
from wanrt.config import from_mapping
from wanrt.errors import ConfigError

CFG = ShardingConfig(shard_size=10, lease_s=5.0, seed=3, max_outstanding=2)


def ask(
    svc: ShardService,
    site: str,
    rank: int = 0,
    *,
    epoch: int = 0,
    want: int = 1,
    fresh: bool = False,
    now: float = 0.0,
    n: int = 95,
):  # type: ignore[no-untyped-def]
    return svc.request(site, rank, epoch=epoch, dataset_len=n, want=want, fresh=fresh, now=now)


def test_shards_cover_the_dataset_once_in_a_seeded_order() -> None:
    svc = ShardService(CFG)
    got = []
    while True:
        g = ask(svc, "a", want=2)
        if g.status != "granted":
            break
        got.extend(g.shards)
        svc.done("a", 0, 0, [s[0] for s in g.shards], 1.0)
    assert g.status == "finished"
    assert sorted(r for s in got for r in range(s[1], s[2])) == list(range(95))
    ids = [s[0] for s in got]
    assert len(ids) == 10 and ids != sorted(ids)  # shuffled between shards
    again = ShardService(CFG)
    ask(again, "b")
    assert ids == again.order(0) and again.order(0) != again.order(1)
    assert svc.stats.repeated == 0 and svc.stats.epochs_completed == 1 and svc.lost() == 0


def test_a_rank_holds_at_most_max_outstanding_and_waits_while_others_hold_the_rest() -> None:
    svc = ShardService(CFG)
    assert len(ask(svc, "a", want=5).shards) == 2
    assert ask(svc, "a").status == "wait"
    for site in "bcd":
        assert len(ask(svc, site, want=2).shards) == 2
    assert len(ask(svc, "e", want=2).shards) == 2
    assert ask(svc, "f").status == "drained"  # all 10 leased, none DONE: the rest is in flight
    assert svc.counts() == {"todo": 0, "doing": 10, "done": 0}


def test_a_lost_holder_s_shards_go_back_to_the_end_of_the_queue_and_count_as_repeats() -> None:
    svc = ShardService(CFG)
    g = ask(svc, "a", want=2)
    assert svc.release("a") == 2 and svc.counts()["doing"] == 0
    ids = []
    while (g2 := ask(svc, "b", want=2)).status == "granted":
        ids += [s[0] for s in g2.shards]
        svc.done("b", 0, 0, [s[0] for s in g2.shards], 1.0)
    assert ids[-2:] == [s[0] for s in g.shards]  # re-queued at the end (§IV-C3)
    assert svc.stats.repeated == 2 and svc.stats.released == 2 and svc.complete


def test_only_the_holder_may_report_and_a_silent_holder_s_lease_expires() -> None:
    svc = ShardService(CFG)
    sid = ask(svc, "a", now=0.0).shards[0][0]
    assert svc.done("b", 0, 0, [sid], 1.0) == 0 and svc.stats.refused == 1
    assert svc.done("a", 1, 0, [sid], 1.0) == 0  # another rank of the same site
    assert svc.next_deadline() == 5.0
    assert svc.expire(4.9) == 0 and svc.expire(5.0) == 1 and svc.stats.expired == 1
    assert svc.done("a", 0, 0, [sid], 6.0) == 1  # late, but nobody else took it: accepted, no repeat
    assert svc.stats.repeated == 0 and svc.done("a", 0, 0, [sid], 6.0) == 0 and svc.stats.duplicate == 1


def test_a_later_epoch_s_request_takes_the_leftovers_of_a_lost_rank() -> None:
    svc = ShardService(ShardingConfig(shard_size=10))
    lost = ask(svc, "a", want=2, n=40)
    rest = ask(svc, "b", want=2, n=40)
    svc.done("b", 0, 0, [s[0] for s in rest.shards], 1.0)
    assert ask(svc, "b", epoch=0, n=40).status == "drained"
    svc.release("a")
    g = ask(svc, "b", epoch=1, n=40, want=2)
    assert g.status == "granted" and g.epoch == 0 and sorted(g.shards) == sorted(lost.shards)
    svc.done("b", 0, 0, [s[0] for s in g.shards], 2.0)
    assert ask(svc, "b", epoch=1, n=40).epoch == 1 and svc.epoch == 1


def test_a_fresh_request_returns_the_earlier_incarnation_s_shards_first_to_the_queue() -> None:
    svc = ShardService(CFG)
    first = {s[0] for s in ask(svc, "a", want=2).shards}
    g = ask(svc, "a", want=2, fresh=True)
    assert {s[0] for s in g.shards}.isdisjoint(first) and svc.stats.released == 2


def test_the_next_epoch_opens_once_this_one_is_drained_and_at_most_two_are_open() -> None:
    svc = ShardService(ShardingConfig(shard_size=50, epochs=3))
    g0 = ask(svc, "a", want=2, n=100)  # both shards of epoch 0 in flight
    assert ask(svc, "b", epoch=0, n=100).status == "drained"
    g1 = ask(svc, "b", epoch=1, n=100, want=2)  # epoch 1 opens although epoch 0 is not DONE
    assert g1.status == "granted" and g1.epoch == 1 and svc.open_epochs() == [0, 1]
    assert ask(svc, "c", epoch=2, n=100).status == "wait"  # a third epoch waits for epoch 0
    svc.release("a")  # epoch 0's shards come back: they go first, also to a rank already in epoch 2
    left = ask(svc, "c", epoch=2, n=100, want=2)
    assert left.status == "granted" and left.epoch == 0 and len(left.shards) == 2
    svc.done("c", 0, 0, [s[0] for s in left.shards], 1.0)
    assert svc.open_epochs() == [1] and svc.stats.epochs_completed == 1 and svc.stats.repeated == 2
    assert ask(svc, "d", epoch=0, n=100).status == "finished"
    assert svc.done("a", 0, 0, [s[0] for s in g0.shards], 2.0) == 0 and svc.stats.stale == 2
    svc.done("b", 0, 1, [s[0] for s in g1.shards], 3.0)
    assert ask(svc, "d", epoch=1, n=100).status == "finished"
    g2 = ask(svc, "d", epoch=2, n=100, want=2)
    assert g2.epoch == 2 and ask(svc, "e", epoch=3, n=100).status == "wait"  # the cap: 3 epochs
    svc.done("d", 0, 2, [s[0] for s in g2.shards], 4.0)
    assert ask(svc, "e", epoch=3, n=100).status == "finished" and svc.lost() == 0


def test_requests_naming_another_dataset_or_a_disabled_service_are_answered_not_raised() -> None:
    svc = ShardService(CFG)
    assert ask(svc, "a", n=95).status == "granted"
    assert ask(svc, "a", n=96).status == "refused"
    assert (
        ShardService(ShardingConfig(max_shards=4, shard_size=1))
        .request("a", 0, epoch=0, dataset_len=5, want=1, fresh=False, now=0.0)
        .status
        == "refused"
    )
    assert ask(ShardService(ShardingConfig(enabled=False)), "a").status == "unavailable"


def test_config_loads_from_its_toml_table_and_names_bad_keys() -> None:
    cfg = from_mapping(ShardingConfig, {"shard_size": 64, "lease_s": 30}, section="scheduler.sharding")
    assert cfg.shard_size == 64 and cfg.lease_s == 30.0
    with pytest.raises(ConfigError) as err:
        from_mapping(ShardingConfig, {"lease_s": 0}, section="scheduler.sharding")
    assert err.value.fields["key"] == "scheduler.sharding.lease_s"
    with pytest.raises(ConfigError):
        from_mapping(ShardingConfig, {"shards": 1}, section="scheduler.sharding")


def test_a_snapshot_keeps_done_shards_and_turns_doing_ones_back_to_todo(tmp_path: Path) -> None:
    path = tmp_path / "shards.json"
    cfg = ShardingConfig(shard_size=10, seed=3, max_outstanding=2, state_file=str(path))
    svc = ShardService(cfg)
    a = [s[0] for s in ask(svc, "a", want=2).shards]
    b = [s[0] for s in ask(svc, "b", want=2).shards]
    svc.done("a", 0, 0, a, 1.0)
    write_state(path, svc.snapshot())
    assert not svc.dirty and not list(tmp_path.glob(".*.tmp"))
    data = read_state(path)
    assert data is not None
    back = ShardService.restore(cfg, data)
    assert back.counts() == {"todo": 8, "doing": 0, "done": 2} and back.lost() == 0
    assert back.done("b", 0, 0, b[:1], 2.0) == 1  # its former holder still reports it
    ids = []
    while (g := ask(back, "c", want=2)).status == "granted":
        ids += [s[0] for s in g.shards]
        back.done("c", 0, 0, [s[0] for s in g.shards], 3.0)
    assert g.status == "finished" and sorted(ids + a + b[:1]) == list(range(10))
    assert back.stats.repeated == 1  # b's other shard: handed out before and after the restart


def test_a_snapshot_of_other_shards_or_a_damaged_one_is_refused(tmp_path: Path) -> None:
    svc = ShardService(CFG)
    ask(svc, "a")
    snap = svc.snapshot()
    with pytest.raises(ConfigError, match="shard_size"):
        ShardService.restore(ShardingConfig(shard_size=11, seed=3), snap)
    with pytest.raises(ConfigError, match=r"damaged|match"):
        ShardService.restore(CFG, {**snap, "epochs": [{**snap["epochs"][0], "states": "T"}]})
    with pytest.raises(ConfigError, match="outside"):
        ShardService.restore(CFG, {**snap, "epochs": [{**snap["epochs"][0], "doing": [[-1, "a", 0]]}]})
    with pytest.raises(ConfigError, match="unknown states"):
        ShardService.restore(CFG, {**snap, "epochs": [{**snap["epochs"][0], "states": "Q" * 10}]})
    (tmp_path / "x.json").write_text("{nope")
    with pytest.raises(ConfigError, match="not JSON"):
        read_state(tmp_path / "x.json")
    assert read_state(tmp_path / "missing.json") is None
    assert json.loads(json.dumps(snap)) == snap


# -- the invariant, under any sequence -------------------------------------------------------------------

HOLDERS = [("a", 0), ("a", 1), ("b", 0)]
EPOCHS_CFG = ShardingConfig(shard_size=10, lease_s=5.0, seed=3, max_outstanding=2, epochs=3)
op = st.one_of(
    st.tuples(st.just("ask"), st.integers(0, 2), st.integers(0, 3), st.integers(1, 3), st.booleans()),
    st.tuples(st.just("done"), st.integers(0, 2), st.integers(0, 2), st.integers(0, 11), st.booleans()),
    st.tuples(st.just("release"), st.integers(0, 2), st.just(0), st.just(0), st.booleans()),
    st.tuples(st.just("expire"), st.just(0), st.just(0), st.just(0), st.booleans()),
    st.tuples(st.just("restart"), st.just(0), st.just(0), st.just(0), st.booleans()),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(op, max_size=80))
def test_no_shard_of_any_epoch_is_ever_lost_and_draining_completes_every_epoch(
    ops: list[tuple[str, int, int, int, bool]],
) -> None:
    cfg = EPOCHS_CFG
    svc = ShardService(cfg)
    now = 0.0
    leases: dict[tuple[str, int], list[tuple[int, int]]] = {h: [] for h in HOLDERS}  # what each was given
    for kind, who, epoch, x, flag in ops:
        now += 1.0
        site, rank = HOLDERS[who]
        if kind == "ask":
            g = ask(svc, site, rank, epoch=epoch, want=x, fresh=flag, now=now)
            leases[(site, rank)] += [(g.epoch, s[0]) for s in g.shards]
        elif kind == "done":
            mine = leases[(site, rank)]
            e, sid = mine.pop(0) if flag and mine else (epoch, x)
            svc.done(site, rank, e, [sid], now)
        elif kind == "release":
            svc.release(site, rank if flag else None)
        elif kind == "expire":
            svc.expire(now + (cfg.lease_s if flag else 0.0))
        else:
            svc = ShardService.restore(cfg, json.loads(json.dumps(svc.snapshot())))
        assert svc.lost() == 0
        assert len(svc.open_epochs()) <= 2
        assert sum(svc.counts().values()) == svc.n_shards * len(svc.open_epochs())
        assert all(len(svc.held_by(*h)) <= cfg.max_outstanding for h in HOLDERS)
    epoch = 0
    for _ in range(200):  # one fresh worker, as the sampler does, drains every epoch: no shard is stuck
        svc.release("a")
        svc.release("b")
        g = ask(svc, "z", epoch=epoch, want=2, now=now)
        if g.status == "granted":
            svc.done("z", 0, g.epoch, [s[0] for s in g.shards], now)
        elif g.status in ("drained", "finished"):
            if g.status == "finished" and epoch >= cfg.epochs:
                break
            epoch = max(epoch, g.epoch + 1)
        else:
            assert g.status != "wait" or svc.held_by("z", 0)  # nobody else holds anything now
    # the first request opens the epoch it names (a trainer resuming there); every later one completes
    first = next((e for kind, _, e, _, _ in ops if kind == "ask" and e < cfg.epochs), 0)
    assert svc.complete and svc.stats.epochs_completed == cfg.epochs - first and svc.lost() == 0
    assert svc.stats.repeated <= svc.stats.done
