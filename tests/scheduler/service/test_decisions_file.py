"""``wanrt scheduler --decisions-file``: one JSON line per commit and per decide tick, with the adaptive
policy's bandwidth estimate once it has one; the daemon writes it as decisions commit."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from scheduler.daemon_config import SchedulerDaemonConfig
from scheduler.node import SchedulerNode
from scheduler.service.daemon import DecisionsFile, SchedulerDaemon
from tests.scheduler.service.test_scheduler_daemon import _sched_cfg
from tools.harness.daemon_cluster import running, short_dir, site_configs, trainers_for
from wanrt.errors import ConfigError
from wanrt.protocol import Telemetry
from wanrt.protocol.scheduler.messages import AnnounceReply

SECRET = "x" * 32


@dataclass
class _Step:
    kind: str


class _Controller:
    def __init__(self) -> None:
        self.bandwidth_estimate_bps = 42e6
        self.last_bandwidth_step: _Step | None = None


class _Adaptive:
    """Shaped like scheduler.adaptive.AdaptivePolicy: ``policy`` is None until the model's size is known."""

    def __init__(self) -> None:
        self.policy: _Controller | None = None

    def observe(self, site: str, metrics: Any, now: float) -> None:
        return None

    def decide(self, now: float) -> dict[str, Any] | None:
        return None

    def committed(self, values: Any, effective_iteration: int) -> None:
        return None


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _committed_node() -> SchedulerNode:
    cfg = SchedulerDaemonConfig(job="j", sites=("a", "b"), secret=SECRET, announce_margin=5)
    node = SchedulerNode(cfg, 0.0)
    for site in ("a", "b"):
        node.gateway_up(site, 0.0)
        node.on_message(site, Telemetry(site, 3, {"frontier": 3}), 0.0)
    node.request({"density": 0.05, "batch_size@a": 48}, 0.1)
    for site in ("a", "b"):
        node.on_message(site, AnnounceReply(1, True, 3), 0.2)
    assert node.current is not None
    return node


def test_lines_carry_the_decision_and_the_estimate_once_the_controller_exists(tmp_path: Path) -> None:
    path = tmp_path / "decisions.jsonl"
    node = _committed_node()
    policy = _Adaptive()
    f = DecisionsFile(path)
    f.write(node, policy, "tick")  # no controller yet: no estimate
    policy.policy = _Controller()
    policy.policy.last_bandwidth_step = _Step("lower")
    f.write(node, policy, "commit")
    f.write(node, policy, "tick")  # the same estimator update: not reported again
    f.write(node, None, "tick")  # a policy without a controller (fixed)
    f.close()
    f.write(node, policy, "tick")  # after close: nothing (a stopping daemon may still tick)
    tick0, commit, tick1, fixed = _lines(path)
    assert tick0["kind"] == "tick" and tick0["bandwidth_estimate_bps"] is None and "values" not in tick0
    assert commit["kind"] == "commit" and commit["decision"] == 1 and commit["effective_iteration"] == 8
    assert commit["values"] == {"density": 0.05, "batch_size@a": 48}
    assert commit["bandwidth_estimate_bps"] == pytest.approx(42e6) and commit["bandwidth_step"] == "lower"
    assert "bandwidth_step" not in tick1 and tick1["decision"] == 1
    assert fixed["bandwidth_estimate_bps"] is None
    assert all(rec["time"] > 1e9 and rec["monotonic"] > 0 for rec in (tick0, commit, tick1, fixed))


def test_an_unwritable_decisions_file_is_a_config_error_naming_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        DecisionsFile(tmp_path / "missing-dir" / "decisions.jsonl")
    assert info.value.fields["key"] == "--decisions-file"


async def test_the_daemon_writes_a_commit_line_and_ticks(tmp_path: Path) -> None:
    path = tmp_path / "decisions.jsonl"
    with short_dir() as tmp:
        scfg = _sched_cfg(tmp)
        configs = site_configs(tmp, "ab", scheduler=f"unix://{tmp}/sched.sock", telemetry_interval_s=0.2)
        async with running(configs) as cluster:
            sched = SchedulerDaemon(scfg, decisions_file=path)
            task = asyncio.create_task(sched.run())
            trainers = trainers_for(cluster, layers=2, iterations=30)
            for t in trainers.values():
                await t.connect()
            runs = [asyncio.create_task(t.run()) for t in trainers.values()]
            async with asyncio.timeout(60):
                await sched.wait_for(lambda: all(g["connected"] for g in sched.status()["gateways"].values()))
                sched.request({"density": 0.05})
                await sched.wait_for(lambda: sched.node.current is not None)
                await asyncio.gather(*runs)
                await sched.wait_for(lambda: '"tick"' in path.read_text())  # decide_interval_s = 0.2
            sched.request_stop()
            await asyncio.wait_for(task, 20)
            for t in trainers.values():
                await t.close()
            await cluster.stop_all()
    recs = _lines(path)
    commits = [r for r in recs if r["kind"] == "commit"]
    current = sched.node.current
    assert current is not None
    assert commits and commits[-1]["decision"] == current.id
    assert commits[-1]["values"] == {"density": 0.05}
    assert commits[-1]["effective_iteration"] == current.effective_iteration
    assert any(r["kind"] == "tick" for r in recs)
    assert [r["monotonic"] for r in recs] == sorted(r["monotonic"] for r in recs)


def test_a_tick_says_what_the_estimator_was_fed_once_per_update(tmp_path: Path) -> None:
    path = tmp_path / "decisions.jsonl"
    node = _committed_node()
    policy = _Adaptive()
    policy.policy = _Controller()
    seen = {"compute_s": 0.02, "iteration_s": 0.05, "idle": 0.6, "payload_bytes": 2e4, "latency_s": 0.045}
    policy.policy.last_observation = seen  # type: ignore[attr-defined]
    f = DecisionsFile(path)
    f.write(node, policy, "tick")
    f.write(node, policy, "tick")  # the same observation: not repeated
    f.close()
    first, second = _lines(path)
    assert first["observed"] == seen
    assert "observed" not in second


def test_a_commit_line_says_why_the_plan_was_made_and_for_what(tmp_path: Path) -> None:
    from scheduler.control.decision import Decision

    path = tmp_path / "decisions.jsonl"
    node = _committed_node()
    policy = _Adaptive()
    policy.policy = _Controller()
    made = Decision(0.005, 0.005, (0, 1), (32, 32), 1, 3.0, "bandwidth_change", 27e6, 0.06, 0.05)
    policy.policy.last_decision = made  # type: ignore[attr-defined]
    f = DecisionsFile(path)
    f.write(node, policy, "commit")
    f.write(node, policy, "tick")
    f.close()
    commit, tick = _lines(path)
    assert commit["reason"] == "bandwidth_change"
    assert commit["plan"] == {
        "bandwidth_bps": 27e6,
        "target_density": 0.005,
        "predicted_compute_s": 0.06,
        "predicted_exchange_s": 0.05,
    }
    assert "reason" not in tick  # a tick is no decision
