"""The scheduler's sans-IO node: two-phase decisions with one job-wide effective iteration, resume."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.daemon_config import SchedulerDaemonConfig
from scheduler.node import SchedulerNode, SendTo
from wanrt.errors import ConfigError, RemoteProtocolError
from wanrt.protocol import Telemetry
from wanrt.protocol.scheduler.messages import Announce, AnnounceReply

SECRET = "x" * 32


def _cfg(**kw: Any) -> SchedulerDaemonConfig:
    base: dict[str, Any] = {"job": "j", "sites": ("a", "b", "c"), "secret": SECRET, "announce_margin": 5}
    base.update(kw)
    return SchedulerDaemonConfig(**base)


class Policy:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, float]]] = []
        self.next: dict[str, Any] | None = None
        self.commits: list[tuple[dict[str, Any], int]] = []

    def observe(self, site: str, metrics: Any, now: float) -> None:
        self.seen.append((site, dict(metrics)))

    def decide(self, now: float) -> dict[str, Any] | None:
        return self.next

    def committed(self, values: Any, effective_iteration: int) -> None:
        self.commits.append((dict(values), effective_iteration))


def _report(node: SchedulerNode, site: str, frontier: int, now: float, **extra: float) -> None:
    node.on_message(site, Telemetry(site, max(frontier, 0), {"frontier": frontier, **extra}), now)


def _announces(node: SchedulerNode) -> list[tuple[str, Announce]]:
    out = []
    for a in node.pop_actions():
        assert isinstance(a, SendTo) and isinstance(a.msg, Announce)
        out.append((a.site, a.msg))
    return out


def _up(node: SchedulerNode, frontiers: dict[str, int]) -> None:
    for s, f in frontiers.items():
        node.gateway_up(s, 0.0)
        _report(node, s, f, 0.0)
    node.pop_actions()


def test_a_decision_is_prepared_everywhere_then_committed_with_one_iteration() -> None:
    policy = Policy()
    node = SchedulerNode(_cfg(decide_interval_s=1.0), 0.0, policy=policy)
    _up(node, {"a": 10, "b": 12, "c": 11})
    policy.next = {"density": 0.05}
    node.tick(1.0)
    prep = _announces(node)
    assert {s for s, _ in prep} == {"a", "b", "c"}
    assert {m.phase for _, m in prep} == {"prepare"}
    assert {m.effective_iteration for _, m in prep} == {12 + 5}  # newest frontier + margin
    decision = prep[0][1].decision
    node.on_message("a", AnnounceReply(decision, True, 10), 1.1)
    node.on_message("b", AnnounceReply(decision, True, 12), 1.1)
    assert _announces(node) == []  # c has not answered
    node.on_message("c", AnnounceReply(decision, True, 11), 1.2)
    commits = _announces(node)
    assert {(s, m.phase, m.effective_iteration) for s, m in commits} == {(s, "commit", 17) for s in "abc"}
    assert node.current is not None and node.current.values == {"density": 0.05}
    assert len(policy.seen) == 3
    assert policy.commits == [({"density": 0.05}, 17)]


def test_a_refusal_aborts_and_prepares_again_further_ahead() -> None:
    node = SchedulerNode(_cfg(), 0.0)
    _up(node, {"a": 10, "b": 10, "c": 10})
    node.request({"staleness": 0}, 1.0)
    first = _announces(node)[0][1]
    node.on_message("b", AnnounceReply(first.decision, False, 30), 1.1)  # b's trainers ran ahead
    msgs = _announces(node)
    aborts = [m for _, m in msgs if m.phase == "abort"]
    again = [m for _, m in msgs if m.phase == "prepare"]
    assert len(aborts) == 3 and all(m.decision == first.decision for m in aborts)
    assert len(again) == 3 and again[0].decision > first.decision
    assert again[0].effective_iteration == 30 + 5
    assert node.stats.decisions_aborted == 1


def test_refusals_for_timing_are_retried_as_often_as_needed_but_a_bad_value_is_given_up() -> None:
    node = SchedulerNode(_cfg(), 0.0)
    _up(node, {"a": 10, "b": 10, "c": 10})
    node.request({"staleness": 0}, 1.0)
    for k in range(6):  # a busy machine: the trainers keep running past the announced iteration
        prep = [m for _, m in _announces(node) if m.phase == "prepare"]
        assert prep, f"given up after {k} refusals for timing"
        node.on_message("b", AnnounceReply(prep[0].decision, False, 30 + 10 * k), 1.1)
    prep = [m for _, m in _announces(node) if m.phase == "prepare"]
    for s in "abc":
        node.on_message(s, AnnounceReply(prep[0].decision, True, 90), 1.2)
    assert node.current is not None and node.current.values == {"staleness": 0}


def test_no_reply_in_time_aborts() -> None:
    node = SchedulerNode(_cfg(reply_timeout_s=2.0), 0.0)
    _up(node, {"a": 0, "b": 0, "c": 0})
    node.request({"density": 0.1}, 1.0)
    _announces(node)
    assert node.next_deadline() == pytest.approx(3.0)
    node.tick(3.0)
    phases = [m.phase for _, m in _announces(node)]
    assert phases.count("abort") == 3 and phases.count("prepare") == 3  # tried again


def test_a_disconnected_gateway_gets_the_commit_when_it_comes_back() -> None:
    node = SchedulerNode(_cfg(), 0.0)
    _up(node, {"a": 0, "b": 0, "c": 0})
    node.request({"density": 0.2}, 1.0)
    d = _announces(node)[0][1].decision
    node.gateway_down("c", 1.1)
    for s in "ab":
        node.on_message(s, AnnounceReply(d, True, 0), 1.2)
    assert {s for s, m in _announces(node) if m.phase == "commit"} == {"a", "b"}
    node.gateway_up("c", 5.0)
    (site, msg), *_ = _announces(node)
    assert site == "c" and msg.phase == "commit" and msg.decision == d


def test_a_restarted_scheduler_resumes_from_what_gateways_run() -> None:
    policy = Policy()
    node = SchedulerNode(_cfg(decide_interval_s=1.0), 0.0, policy=policy)
    node.gateway_up("a", 0.0)
    node.gateway_up("b", 0.0)
    policy.next = {"density": 0.5}
    _report(node, "a", 40, 0.5, decision=7, decision_effective=33, **{"cfg.density": 0.05})
    node.tick(1.0)
    assert _announces(node) == []  # b has not reported yet: nothing is decided
    _report(node, "b", 41, 1.5, decision=7, decision_effective=33, **{"cfg.density": 0.05})
    assert node.current is not None and node.current.id == 7 and node.current.values == {"density": 0.05}
    node.tick(2.0)
    prep = _announces(node)
    assert prep and all(m.decision == 8 and m.values == {"density": 0.5} for _, m in prep)
    assert prep[0][1].effective_iteration == 41 + 5


def test_bad_input_is_refused() -> None:
    node = SchedulerNode(_cfg(), 0.0)
    with pytest.raises(ConfigError) as exc:
        node.request({"staleness": 1000}, 0.0)
    assert exc.value.fields.get("key") == "staleness"
    with pytest.raises(RemoteProtocolError):
        node.on_message("a", Telemetry("b", 0, {}), 0.0)  # a may not report for b
    with pytest.raises(RemoteProtocolError):
        node.on_message("a", Announce(1, "commit", 5, {"density": 0.1}), 0.0)  # not a gateway's message
    assert node.gateway_problem("z") is not None and node.gateway_problem("a") is None


def test_config_names_the_bad_key() -> None:
    with pytest.raises(ConfigError) as exc:
        _cfg(announce_margin=0)
    assert exc.value.fields.get("key") == "announce_margin"
    with pytest.raises(ConfigError):
        _cfg(sites=("a", "a"))


def _commit_pending(node: SchedulerNode, now: float) -> None:
    prep = _announces(node)
    assert prep and {m.phase for _, m in prep} == {"prepare"}
    for site, m in prep:
        node.on_message(site, AnnounceReply(m.decision, True, 0), now)
    node.pop_actions()


def test_a_manual_value_holds_against_the_policy_until_released() -> None:
    """Issue 21: a manual POST /config was accepted and silently replaced by the adaptive policy 3 s
    later. It holds now (the policy decides only the other keys), /status says so, and a release hands
    the key back."""
    policy = Policy()
    node = SchedulerNode(_cfg(decide_interval_s=1.0), 0.0, policy=policy)
    _up(node, {"a": 10, "b": 10, "c": 10})
    assert node.status(0.0)["control"] == {"mode": "adaptive", "held": {}}
    out = node.request({"density": 0.2}, 0.5)
    assert out["mode"] == "manual" and out["held"] == {"density": 0.2}
    _commit_pending(node, 0.6)
    policy.next = {"density": 0.01, "density@b": 0.02, "staleness": 0}
    node.tick(1.0)
    _commit_pending(node, 1.1)
    assert node.current is not None and node.current.values == {"density": 0.2, "staleness": 0}
    assert node.status(1.2)["control"] == {"mode": "manual", "held": {"density": 0.2}}
    with pytest.raises(ConfigError, match="staleness: not held"):
        node.release(["staleness"])
    assert node.release(None) == {"released": ["density"], "mode": "adaptive", "held": {}}
    node.tick(2.0)
    _commit_pending(node, 2.1)
    assert node.current.values == {"density": 0.01, "density@b": 0.02, "staleness": 0}
