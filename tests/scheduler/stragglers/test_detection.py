"""AntDT's two-window detection (transient vs persistent) and the all-links-slow detector, on synthetic
series."""

from __future__ import annotations

import pytest

from scheduler.stragglers import DetectionConfig, LinkConfig, LinkSlowdownDetector, StragglerDetector
from wanrt.config import from_mapping
from wanrt.errors import ConfigError, LocalProtocolError

CFG = DetectionConfig(slowness=1.5, short_s=60.0, long_s=600.0, per_sample=False)
RANKS = [f"r{i}" for i in range(5)]


def feed(det: StragglerDetector, t0: float, t1: float, slow: dict[str, float], dt: float = 1.0) -> float:
    """Every rank reports BPT 1.0 s every ``dt`` (× its slowdown factor) from t0 to t1; returns t1."""
    t = t0
    while t < t1:
        t += dt
        for r in det.members:
            det.observe(r, t, 1.0 * slow.get(r, 1.0), batch=100)
    return t


def test_a_short_burst_is_transient() -> None:
    det = StragglerDetector(RANKS, CFG)
    t = feed(det, 0.0, 600.0, {})
    t = feed(det, t, t + 60.0, {"r1": 3.0})  # one minute at 3×: fills the short window only
    rep = det.report(t)
    assert rep.transient == ["r1"]
    assert rep.persistent == []
    assert rep.members["r1"].short_ratio == pytest.approx(3.0 / (3.0 + 4.0) * 5.0)


def test_a_long_slowdown_is_persistent() -> None:
    det = StragglerDetector(RANKS, CFG)
    t = feed(det, 0.0, 600.0, {"r2": 3.0})
    rep = det.report(t)
    assert rep.persistent == ["r2"]
    assert rep.transient == []  # persistent wins over transient
    assert rep.members["r2"].kind == "persistent"


def test_a_recovered_straggler_is_no_longer_transient() -> None:
    det = StragglerDetector(RANKS, CFG)
    t = feed(det, 0.0, 60.0, {"r0": 3.0})
    t = feed(det, t, t + 120.0, {})
    assert det.report(t).transient == []


def test_mild_slowness_below_lambda_is_nothing() -> None:
    det = StragglerDetector(RANKS, CFG)
    t = feed(det, 0.0, 600.0, {"r3": 1.4})
    assert all(s.kind == "none" for s in det.report(t).members.values())


def test_persistent_needs_the_long_window_covered() -> None:
    det = StragglerDetector(RANKS, CFG)  # min_coverage 0.5 of 600 s
    t = feed(det, 0.0, 200.0, {"r4": 4.0})
    rep = det.report(t)
    assert rep.persistent == []
    assert rep.transient == ["r4"]
    t = feed(det, t, 400.0, {"r4": 4.0})
    assert det.report(t).persistent == ["r4"]


def test_forget_clears_a_restarted_member() -> None:
    det = StragglerDetector(RANKS, CFG)
    t = feed(det, 0.0, 600.0, {"r2": 3.0})
    det.forget("r2")
    rep = det.report(t)
    assert rep.members["r2"].short_s is None
    assert rep.persistent == []


def test_per_sample_sees_through_batch_adjustment() -> None:
    """After ADJUST_BS gave r0 a quarter of the batch its BPT looks normal, its time per sample does not."""
    per_sample = StragglerDetector(["a", "b"], DetectionConfig(short_s=60, long_s=600, per_sample=True))
    raw = StragglerDetector(["a", "b"], DetectionConfig(short_s=60, long_s=600, per_sample=False))
    for t in range(1, 61):
        for det in (per_sample, raw):
            det.observe("a", float(t), 1.0, batch=25)  # 4× slower per sample, on a quarter batch
            det.observe("b", float(t), 1.0, batch=100)
    assert raw.report(60.0).transient == []
    assert per_sample.report(60.0).transient == ["a"]


def test_throughput_is_the_mean_of_batch_over_bpt() -> None:
    det = StragglerDetector(["a"], CFG)
    det.observe("a", 1.0, 2.0, batch=100)
    det.observe("a", 2.0, 1.0, batch=100)
    assert det.throughput("a", 2.0) == pytest.approx((50.0 + 100.0) / 2)
    assert det.throughput("a", 1000.0) is None  # outside the short window


def test_bad_reports_are_rejected() -> None:
    det = StragglerDetector(["a"], CFG)
    with pytest.raises(LocalProtocolError):
        det.observe("b", 1.0, 1.0)
    with pytest.raises(LocalProtocolError):
        det.observe("a", 1.0, 0.0)
    det.observe("a", 5.0, 1.0)
    with pytest.raises(LocalProtocolError):
        det.observe("a", 4.0, 1.0)  # time went backwards


def test_config_validation() -> None:
    with pytest.raises(ConfigError) as exc:
        from_mapping(DetectionConfig, {"slowness": 1.1}, section="scheduler.stragglers.detection")
    assert exc.value.fields["key"] == "scheduler.stragglers.detection.slowness"
    with pytest.raises(ConfigError):
        DetectionConfig(short_s=600, long_s=300)


LINKS = ["a-b", "a-c", "a-d"]


def feed_links(det: LinkSlowdownDetector, t0: float, t1: float, factor: dict[str, float]) -> float:
    t = t0
    while t < t1:
        t += 1.0
        det.observe(t, {link: 0.1 * factor.get(link, 1.0) for link in LINKS}, confirmed=())
    return t


def test_all_links_slow_is_detected_against_their_own_past() -> None:
    det = LinkSlowdownDetector(LINKS, LinkConfig(short_s=30, long_s=600))
    t = feed_links(det, 0.0, 300.0, {})
    assert not det.report(t).all_slow
    t = feed_links(det, t, t + 30.0, dict.fromkeys(LINKS, 2.0))
    rep = det.report(t)
    assert rep.all_slow
    assert rep.slow_links == tuple(LINKS)
    assert rep.ratios["a-b"] == pytest.approx(2.0)


def test_one_slow_link_is_not_a_wan_slowdown() -> None:
    det = LinkSlowdownDetector(LINKS, LinkConfig(short_s=30, long_s=600))
    t = feed_links(det, 0.0, 300.0, {})
    t = feed_links(det, t, t + 30.0, {"a-c": 3.0})
    rep = det.report(t)
    assert not rep.all_slow
    assert rep.slow_links == ("a-c",)


def test_the_gateways_confirmed_stragglers_pass_through() -> None:
    det = LinkSlowdownDetector(LINKS)
    det.observe(1.0, {"a-b": 0.1}, confirmed=["a-d"])
    assert det.report(1.0).confirmed == ("a-d",)
    with pytest.raises(LocalProtocolError):
        det.observe(2.0, {"x-y": 0.1})
