"""KILL_RESTART of persistent straggler ranks in the daemon's site policy, on synthetic telemetry."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.stragglers.config import BatchConfig, DetectionConfig
from scheduler.stragglers.daemon_policy import SiteStragglerPolicy
from scheduler.stragglers.site_config import SiteStragglerConfig
from wanrt.config import from_mapping
from wanrt.errors import ConfigError, RemoteProtocolError
from wanrt.protocol.job_settings import JobSettings

DET = DetectionConfig(slowness=1.5, short_s=5.0, long_s=10.0, min_coverage=0.5)


def _cfg(**kw: Any) -> SiteStragglerConfig:
    base: dict[str, Any] = {
        "detection": DET,
        "batch": BatchConfig(rebalance_gain=0.05),
        "kill_restart": True,
        "restart_cooldown_s": 0.0,
    }
    base.update(kw)
    return SiteStragglerConfig(**base)


class Job:
    """Sites' gateway reports, one per iteration and site: per-rank times as the leaders send them."""

    def __init__(self, policy: SiteStragglerPolicy, worlds: dict[str, int]) -> None:
        self.policy, self.worlds = policy, worlds
        self.it = dict.fromkeys(worlds, 0)
        self.now = 0.0

    def run(self, seconds: float, times: dict[str, list[float]], dt: float = 0.5) -> list[JobSettings]:
        """Report every ``dt`` for ``seconds``, decide after each round; the decisions made."""
        out = []
        end = self.now + seconds
        while self.now < end - 1e-9:
            self.now += dt
            for site, world in self.worlds.items():
                t = times[site]
                m = {
                    "trainer.iteration": float(self.it[site]),
                    "trainer.compute_s": max(t),
                    "trainer.batch_size": 16.0,
                    "trainer.world_size": float(world),
                    **{f"trainer.rank.{r}.compute_s": t[r] for r in range(world)},
                }
                self.policy.observe(site, m, self.now)
                self.it[site] += 1
            d = self.policy.decide(self.now)
            if d:
                out.append(d)
        return out


def test_a_persistent_straggler_rank_at_a_one_rank_site_is_ordered_restarted_once() -> None:
    policy = SiteStragglerPolicy(["a", "b", "c"], _cfg())
    job = Job(policy, {"a": 1, "b": 1, "c": 1})
    slow = {"a": [0.1], "b": [0.1], "c": [0.4]}
    decisions = job.run(6.0, slow)
    assert decisions == [JobSettings(site_restart={"c": 0})]  # alone: no batch split in the same decision
    (d,) = policy.last_restarts
    assert d.member == "c/0" and d.scope == "rank" and "every rank of the job" in d.reason
    # the order runs from iteration 20; the old process keeps reporting its slow iterations until then
    policy.committed(JobSettings(site_restart={"c": 0}), 20)
    assert job.run(3.0, slow) == []
    # the new process is fast: nothing more, however long it runs
    assert job.run(20.0, {"a": [0.1], "b": [0.1], "c": [0.1]}) == []
    assert policy.ranks.restarts == {"c/0": 1}


def test_a_slow_rank_is_compared_with_its_sites_ranks() -> None:
    policy = SiteStragglerPolicy(["a", "b"], _cfg())
    job = Job(policy, {"a": 4, "b": 4})
    # site a as a whole is as fast as b, except its rank 2; b's ranks are all equally slower than a's
    decisions = job.run(6.0, {"a": [0.1, 0.1, 0.5, 0.1], "b": [0.3, 0.3, 0.3, 0.3]})
    assert decisions and decisions[0] == JobSettings(site_restart={"a": 2})
    assert "its site's ranks" in policy.last_restarts[0].reason
    assert all("b" not in d.site_restart for d in decisions)


def test_off_by_default_the_site_gets_adjust_bs_as_before() -> None:
    policy = SiteStragglerPolicy(["a", "b", "c"], _cfg(kill_restart=False))
    job = Job(policy, {"a": 1, "b": 1, "c": 1})
    decisions = job.run(6.0, {"a": [0.1], "b": [0.1], "c": [0.4]})
    assert decisions and all(not d.site_restart for d in decisions)
    assert decisions[0].site_batch_size["c"] < 16


def test_a_rank_that_stays_slow_after_max_restarts_falls_back_to_adjust_bs() -> None:
    policy = SiteStragglerPolicy(["a", "b", "c"], _cfg(max_restarts=2))
    job = Job(policy, {"a": 1, "b": 1, "c": 1})
    slow = {"a": [0.1], "b": [0.1], "c": [0.4]}
    orders = []
    for _ in range(6):
        for d in job.run(6.0, slow):
            if "c" in d.site_restart:
                orders.append(d)
                policy.committed(d, job.it["c"] + 1)
            else:
                policy.committed(d, job.it["c"] + 1)
                assert d.site_batch_size["c"] < 16  # ADJUST_BS once the restarts are used up
                assert len(orders) == 2
                return
    raise AssertionError(f"no ADJUST_BS after {len(orders)} restarts")


def test_the_cooldown_holds_a_second_order_back() -> None:
    policy = SiteStragglerPolicy(["a", "b", "c"], _cfg(restart_cooldown_s=30.0, max_restarts=5))
    job = Job(policy, {"a": 1, "b": 1, "c": 1})
    slow = {"a": [0.1], "b": [0.1], "c": [0.4]}
    first = job.run(6.0, slow)
    assert first == [JobSettings(site_restart={"c": 0})]
    policy.committed(first[0], job.it["c"])
    # still slow (the restart did not help): ADJUST_BS meanwhile is not what this test is about, only that
    # no second restart comes before the cooldown ends
    later = job.run(20.0, slow)
    assert not any("c" in d.site_restart for d in later)
    for d in later:
        policy.committed(d, job.it["c"])
    assert any("c" in d.site_restart for d in job.run(20.0, slow))


def test_an_order_never_committed_stops_holding_the_site_back() -> None:
    policy = SiteStragglerPolicy(["a", "b", "c"], _cfg(max_restarts=5))
    job = Job(policy, {"a": 1, "b": 1, "c": 1})
    slow = {"a": [0.1], "b": [0.1], "c": [0.4]}
    assert job.run(6.0, slow) == [JobSettings(site_restart={"c": 0})]
    # the node gave the decision up: no commit. After long_s the site's samples count again
    assert any("c" in d.site_restart for d in job.run(20.0, slow))


def test_a_site_that_stopped_reporting_is_not_restarted_on_old_samples() -> None:
    policy = SiteStragglerPolicy(["a", "b"], _cfg())
    job = Job(policy, {"a": 1, "b": 1})
    job.run(4.0, {"a": [0.1], "b": [0.45]})  # not yet half a long window of samples
    job.now += 6.0  # the job ended: no more reports; the long window still holds them
    assert policy.decide(job.now) is None


def test_malformed_rank_keys_end_that_gateways_report() -> None:
    policy = SiteStragglerPolicy(["a", "b"], _cfg())
    base = {"trainer.iteration": 1.0, "trainer.compute_s": 0.1, "trainer.batch_size": 8.0}
    with pytest.raises(RemoteProtocolError):
        policy.observe("a", {**base, "trainer.world_size": 2.0, "trainer.rank.2.compute_s": 0.1}, 1.0)
    with pytest.raises(RemoteProtocolError):
        policy.observe(
            "b", {**base, "trainer.world_size": 1.0, "trainer.rank.0.compute_s": float("nan")}, 1.0
        )


def test_config_keys_and_their_bounds() -> None:
    cfg = from_mapping(
        SiteStragglerConfig,
        {"kill_restart": True, "max_restarts": 1, "restart_cooldown_s": 60.0},
        section="s",
    )
    assert cfg.kill_restart and cfg.max_restarts == 1 and cfg.restart_cooldown_s == 60.0
    assert SiteStragglerConfig().kill_restart is False and SiteStragglerConfig().max_restarts == 3
    for bad in ({"max_restarts": -1}, {"restart_cooldown_s": -1.0}, {"kill_restart": 1}):
        with pytest.raises(ConfigError):
            SiteStragglerConfig(**bad)  # type: ignore[arg-type]
