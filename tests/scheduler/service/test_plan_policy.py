"""STAR's parent–child mode decided by the scheduler daemon's straggler policy (``modes`` includes
``parent_child``): Eq. 3 against Eq. 1 on the sites' measured times, the plan settings it announces, the
way back when the straggler recovers, and the ``[scheduler.stragglers]`` keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.daemon_config import load_scheduler_config
from scheduler.node import SchedulerNode
from scheduler.stragglers.config import DetectionConfig, ModeConfig
from scheduler.stragglers.daemon_policy import SiteStragglerPolicy
from scheduler.stragglers.site_config import SiteStragglerConfig
from scheduler.stragglers.star_modes import choose_mode, parent_child_time, progress_time
from tests.scheduler.service.test_straggler_policy import feed, report
from wanrt.errors import ConfigError
from wanrt.protocol import Telemetry
from wanrt.protocol.scheduler.messages import Announce, AnnounceReply

DETECT = DetectionConfig(slowness=1.3, short_s=2.0, long_s=4.0, min_coverage=0.5)
BATCH = 32


def _policy(sites: tuple[str, ...], **kw: object) -> SiteStragglerPolicy:
    cfg = SiteStragglerConfig(detection=DETECT, modes=("parent_child",), **kw)  # type: ignore[arg-type]
    return SiteStragglerPolicy(sites, cfg)


def test_a_persistent_straggler_gets_parent_child_when_eq3_beats_eq1() -> None:
    times = {"a": 0.1, "b": 0.1, "c": 0.3}
    policy = _policy(("a", "b", "c"), noise_scale=20.0)
    feed(policy, times, 0.0, 5.0)
    values = policy.decide(5.0)
    assert values is not None
    assert values["topology"] == "parent_child" and values["stragglers"] == "c"
    assert not any(k.startswith("batch_size") for k in values)  # adjust_bs is not among the modes
    # the same choice as STAR's Eq. 1–3 on the same inputs (per-site iteration time = samples / v_i)
    m = 3 * BATCH
    choice = choose_mode([0.1, 0.1, 0.3], 20.0, m, ModeConfig(modes=("bsp", "parent_child"), max_wait_s=0.3))
    assert choice.kind == "parent_child" and values["t_w_s"] == pytest.approx(choice.wait)
    eq3, _ = parent_child_time([0.1, 0.1, 0.3], 20.0, m, 1, values["t_w_s"])
    eq1 = progress_time(20.0, m, 3, 3, 0.3)
    assert eq3 < eq1
    last = policy.plan.last
    assert last is not None and last.announced
    assert last.chosen.time == pytest.approx(eq3) and last.bsp_s == pytest.approx(eq1)


def test_no_plan_change_when_eq1_wins() -> None:
    # two sites, c 1.9× slower: detected (λ = 1.3), but removing it halves every update's batch; with a
    # large noise scale Eq. 3's extra updates cost more than waiting for c does
    times = {"a": 0.1, "c": 0.19}
    m = 2 * BATCH
    phi = 1000.0
    assert progress_time(phi, m, 2, 2, 0.19) < parent_child_time([0.1, 0.19], phi, m, 1, 0.0)[0]
    policy = _policy(("a", "c"), noise_scale=phi)
    feed(policy, times, 0.0, 5.0)
    assert policy.decide(5.0) is None
    assert policy.last_report is not None and policy.last_report.persistent == ["c"]
    # the same sites with φ = 0: Eq. 3 wins
    policy = _policy(("a", "c"), noise_scale=0.0)
    feed(policy, times, 0.0, 5.0)
    values = policy.decide(5.0)
    assert values is not None and values["stragglers"] == "c" and values["t_w_s"] == 0.0


def test_a_transient_slowdown_does_not_replan() -> None:
    # a long window that 5 s of reports do not cover yet: nobody can be persistent
    detect = DetectionConfig(slowness=1.3, short_s=1.0, long_s=20.0, min_coverage=0.5)
    policy = SiteStragglerPolicy(
        ("a", "b", "c"), SiteStragglerConfig(detection=detect, modes=("parent_child",))
    )
    feed(policy, {"a": 0.1, "b": 0.1, "c": 0.1}, 0.0, 4.0)
    it = feed(policy, {"a": 0.1, "b": 0.1, "c": 0.5}, 4.25, 5.0, it0=100)
    assert it > 100
    report = policy.detector.report(5.0)
    assert "c" in report.transient and not report.persistent
    assert policy.decide(5.0) is None


def test_the_plan_goes_back_when_the_straggler_recovers_and_does_not_flap_meanwhile() -> None:
    policy = _policy(("a", "b", "c"), base_topology="ring")
    it = feed(policy, {"a": 0.1, "b": 0.1, "c": 0.3}, 0.0, 5.0)
    values = policy.decide(5.0)
    assert values is not None
    policy.committed(values, 40)
    assert policy.plan.children == ("c",)
    it = feed(policy, {"a": 0.1, "b": 0.1, "c": 0.3}, 5.25, 6.0, it0=it)
    assert policy.decide(6.0) is None  # the same plan is running
    feed(policy, {"a": 0.1, "b": 0.1, "c": 0.1}, 6.25, 12.0, it0=it)
    back = policy.decide(12.0)
    assert back == {"topology": "ring", "stragglers": ""}
    policy.committed({**values, **back}, 80)
    assert policy.plan.children == ()


def test_default_modes_keep_adjust_bs_only() -> None:
    policy = SiteStragglerPolicy(("a", "b", "c"), SiteStragglerConfig(detection=DETECT))
    assert policy.cfg.modes == ("adjust_bs",)
    feed(policy, {"a": 0.1, "b": 0.1, "c": 0.3}, 0.0, 5.0)
    values = policy.decide(5.0)
    assert values is not None and "batch_size@c" in values and "topology" not in values


def test_both_modes_announce_batch_split_and_plan_in_one_decision() -> None:
    cfg = SiteStragglerConfig(detection=DETECT, modes=("adjust_bs", "parent_child"))
    policy = SiteStragglerPolicy(("a", "b", "c"), cfg)
    feed(policy, {"a": 0.1, "b": 0.1, "c": 0.3}, 0.0, 5.0)
    values = policy.decide(5.0)
    assert values is not None and "batch_size@c" in values and values["stragglers"] == "c"


def test_the_mode_keys_load_from_toml_and_bad_ones_are_named(tmp_path: Path) -> None:
    p = tmp_path / "job.toml"
    head = (
        '[scheduler]\njob = "j"\nsites = ["a", "b", "c"]\nsecret = "'
        + "s" * 32
        + '"\npolicy = "stragglers"\n'
    )
    p.write_text(
        head + '[scheduler.stragglers]\nmodes = ["adjust_bs", "parent_child"]\nnoise_scale = 64.0\n'
        'max_wait_s = 0.2\nbase_topology = "ring"\n'
    )
    cfg = load_scheduler_config(p).stragglers
    assert cfg.modes == ("adjust_bs", "parent_child") and cfg.noise_scale == 64.0
    assert (cfg.max_wait_s, cfg.base_topology) == (0.2, "ring")
    for bad, key in [
        ('modes = ["kill_restart"]', "modes"),
        ("noise_scale = -1.0", "noise_scale"),
        ('base_topology = "parent_child"', "base_topology"),
    ]:
        p.write_text(head + "[scheduler.stragglers]\n" + bad + "\n")
        with pytest.raises(ConfigError) as err:
            load_scheduler_config(p)
        assert str(err.value.fields["key"]).startswith(f"scheduler.stragglers.{key}")


def test_a_decision_every_gateway_refuses_is_given_up_not_retried_forever() -> None:
    from scheduler.daemon_config import SchedulerDaemonConfig

    cfg = SchedulerDaemonConfig(job="j", sites=("a", "b"), secret="s" * 32, decide_interval_s=1.0)
    node = SchedulerNode(cfg, 0.0)
    for s in ("a", "b"):
        node.gateway_up(s, 0.0)
        node.on_message(s, Telemetry(s, 0, {"frontier": 0.0}), 0.0)
    node.request({"topology": "parent_child", "stragglers": "b"}, 0.0)
    prepares = 0
    for _ in range(10):
        sent = [a.msg for a in node.pop_actions() if isinstance(a.msg, Announce) and a.msg.phase == "prepare"]
        if not sent:
            break
        prepares += 1
        node.on_message("a", AnnounceReply(sent[0].decision, False, 0, "stragglers: 'b' unknown"), 0.0)
    assert prepares == 3 and node.current is None and node.pending is None
    with pytest.raises(ConfigError) as err:
        node.request({"topology": "parent_child", "stragglers": "z"}, 0.0)
    assert err.value.fields["key"] == "stragglers"


def test_a_restarted_scheduler_learns_the_running_plan_from_telemetry_and_still_announces_recovery() -> None:
    policy = _policy(("a", "b", "c"), base_topology="ring")
    running = {"plan.parent_child": 1.0, "plan.straggler.c": 1.0, "plan.t_w_s": 0.0}
    it = 0
    t = 0.0
    while t <= 6.0:  # c has recovered: every site equally fast
        for s in ("a", "b", "c"):
            policy.observe(s, {**report(s, it, 0.1), **running}, t)
        it += 1
        t += 0.25
    assert policy.plan.children == ("c",)
    assert policy.decide(6.0) == {"topology": "ring", "stragglers": ""}
