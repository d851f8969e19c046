"""The receivers' tail-dispersion rate: it replaces the sender's delivery sample of the same direction
while fresh, is filtered by its median (or max), and arrives from the receiving gateway's keys."""

from __future__ import annotations

import dataclasses

import pytest

from scheduler.adaptive import AdaptivePolicy
from scheduler.control.config import SchedulerConfig
from scheduler.control.convergence import PowerLawConvergence
from scheduler.control.link_rate import LinkRates
from wanrt.errors import ConfigError, RemoteProtocolError

M = 1e6


def _cfg(**kw: object) -> SchedulerConfig:
    return dataclasses.replace(SchedulerConfig(), **kw)  # type: ignore[arg-type]


def _windows(lr: LinkRates, link: str, mbits: list[float], t0: float, *, rx: bool) -> float:
    """One 40 ms window per 0.25 s report at each of ``mbits``; returns the last report's time."""
    observe = lr.observe_rx if rx else lr.observe_backlog
    nbytes = secs = 0.0
    t = t0
    observe(link, nbytes=nbytes, seconds=secs, now=t)
    for mbit in mbits:
        t += 0.25
        nbytes += mbit * M / 8 * 0.04
        secs += 0.04
        observe(link, nbytes=nbytes, seconds=secs, now=t)
    return t


def test_the_receivers_rate_replaces_the_senders_sample_of_that_direction() -> None:
    lr = LinkRates(_cfg(link_delivery_max_age_s=1.0))
    _windows(lr, "a>b", [41, 41, 41], 0.0, rx=False)  # the sender reads the burst as rate
    _windows(lr, "c>b", [100, 100, 100], 0.0, rx=False)
    assert lr.delivery_bps(0.75) == pytest.approx(41 * M)
    _windows(lr, "a>b", [30, 30, 30], 0.0, rx=True)
    assert lr.delivery_bps(0.75) == pytest.approx(30 * M)
    assert set(lr.rx_windows()) == {"a>b"}
    # the tails stop (a faster link: each tail under the minimum) while the sender still samples
    _windows(lr, "a>b", [95, 95, 95, 95, 95, 95, 95, 95], 0.75, rx=False)
    _windows(lr, "c>b", [100] * 8, 0.75, rx=False)
    assert lr.delivery_bps(2.75) == pytest.approx(95 * M)


def test_the_median_filter_ignores_one_fast_or_slow_tail_and_max_takes_the_best() -> None:
    med = LinkRates(_cfg(link_delivery_max_age_s=1.0))
    _windows(med, "a>b", [30, 60, 31], 0.0, rx=True)  # a stalled receiver's batched reads: one fast tail
    assert med.delivery_bps(0.75) == pytest.approx(31 * M)
    mx = LinkRates(_cfg(link_delivery_max_age_s=1.0, link_rx_filter="max"))
    _windows(mx, "a>b", [30, 60, 31], 0.0, rx=True)
    assert mx.delivery_bps(0.75) == pytest.approx(60 * M)
    with pytest.raises(ConfigError) as exc:
        _cfg(link_rx_filter="mean")
    assert exc.value.key == "link_rx_filter"
    with pytest.raises(ConfigError) as exc:
        _cfg(link_rx_max_age_s=0.0)
    assert exc.value.key == "link_rx_max_age_s"


def test_the_median_looks_back_link_rx_max_age_s() -> None:
    # three slow windows in a row among steady ones: over 1 s (5 windows) they are the median, over 2 s
    # (9 windows) they are not
    for age, want in ((1.0, 22.0), (2.0, 30.0)):
        lr = LinkRates(_cfg(link_delivery_max_age_s=1.0, link_rx_max_age_s=age))
        t = _windows(lr, "c>a", [30, 31, 30, 31, 30, 31, 30, 22, 14, 20], 0.0, rx=True)
        assert lr.delivery_bps(t) == pytest.approx(want * M)


def test_fast_tails_count_in_the_median_and_a_fast_majority_leaves_the_link_out() -> None:
    lr = LinkRates(_cfg(link_delivery_max_age_s=1.0))
    _windows(lr, "a>b", [41, 41, 41], 0.0, rx=False)
    _windows(lr, "c>b", [90, 90, 90], 0.0, rx=False)
    # b measured three a→b tails (a slowed one at 50, two at 95) and four were too fast to measure
    t = 0.0
    lr.observe_rx("a>b", nbytes=0, seconds=0, n=0, fast=0, now=t)
    nbytes = secs = 0.0
    for k, mbit in enumerate([50.0, 95.0, 95.0]):
        t += 0.25
        nbytes += mbit * M / 8 * 0.025
        secs += 0.025
        lr.observe_rx("a>b", nbytes=nbytes, seconds=secs, n=k + 1, fast=0, now=t)
    assert lr.delivery_bps(t) == pytest.approx(90 * M)  # the censored-free median, 95; c>b is slower
    lr.observe_rx("a>b", nbytes=nbytes, seconds=secs, n=3, fast=4, now=t + 0.1)
    # most tails crossed too fast to measure: a → b is not the bottleneck, and its sender's 41 is not B
    assert lr.delivery_bps(t + 0.1) == pytest.approx(90 * M)
    assert lr._rx["a>b"].judged(t + 0.1, 1.0) == ("fast", None)
    # the old sender-side sample stays out while the judgement is fresh; both age out together
    assert lr.delivery_bps(t + 2.0) is None


def test_a_fast_minority_lifts_the_median_above_the_slowed_tails() -> None:
    lr = LinkRates(_cfg(link_delivery_max_age_s=1.0))
    t = 0.0
    lr.observe_rx("a>b", nbytes=0, seconds=0, n=0, fast=0, now=t)
    nbytes = secs = 0.0
    for k, mbit in enumerate([60.0, 70.0, 100.0]):
        t += 0.25
        nbytes += mbit * M / 8 * 0.025
        secs += 0.025
        lr.observe_rx("a>b", nbytes=nbytes, seconds=secs, n=k + 1, fast=2, now=t)
    # tails 60, 70, 100 and two fast (∞): the median of five is 100, not the measured median 70
    assert lr.delivery_bps(t) == pytest.approx(100 * M)


def test_a_direction_paced_by_its_sender_is_left_out() -> None:
    lr = LinkRates(_cfg(link_delivery_max_age_s=1.0))
    _windows(lr, "a>b", [50, 50, 50], 0.0, rx=True)  # a paces a → b at 52 (a donor of the allocator)
    _windows(lr, "a>c", [95, 95, 95], 0.0, rx=True)
    lr.observe_pacing("a>b", 52e6, now=0.75)
    lr.observe_pacing("a>c", 130e6, now=0.75)  # boosted: 95 is the link's, not the pacer's
    assert lr.delivery_bps(0.75) == pytest.approx(95 * M)
    lr.observe_pacing("a>c", 100e6, now=0.75)  # at the base rate, 95 may be the pacer's too
    assert lr.delivery_bps(0.75) is None
    with pytest.raises(RemoteProtocolError):
        lr.observe_pacing("a>b", 0.0, now=1.0)
    with pytest.raises(ConfigError):
        _cfg(link_paced_share=0.0)


def test_too_few_windows_or_rx_off_leave_the_senders_sample() -> None:
    lr = LinkRates(_cfg(link_delivery_max_age_s=1.0))
    _windows(lr, "a>b", [41, 41, 41], 0.0, rx=False)
    _windows(lr, "a>b", [30, 30], 0.25, rx=True)  # two windows: fewer than link_delivery_min_samples
    assert lr.delivery_bps(0.75) == pytest.approx(41 * M)
    off = LinkRates(_cfg(link_delivery_max_age_s=1.0, link_rx=False))
    _windows(off, "a>b", [41, 41, 41], 0.0, rx=False)
    _windows(off, "a>b", [30, 30, 30], 0.0, rx=True)
    assert off.delivery_bps(0.75) == pytest.approx(41 * M)
    with pytest.raises(RemoteProtocolError):
        lr.observe_rx("a>b", nbytes=-1.0, seconds=1.0, now=1.0)


def test_the_receiving_gateways_keys_name_the_senders_direction() -> None:
    policy = AdaptivePolicy(("a", "b"), _cfg(bw_initial_bps=100 * M), PowerLawConvergence())
    now = 0.0
    for k in range(16):  # 0.25 s reports; a → b: a reads 41 from its acks, b 30 from the tails
        now = 0.25 * k
        for site, peer in (("a", "b"), ("b", "a")):
            batch = 8 + k % 3 * 8
            rep = {
                "frontier": float(k),
                "cfg.density": 0.01,
                "cfg.staleness": 1.0,
                "trainer.iteration": float(k),
                "trainer.params": 1e6,
                "trainer.world_size": 1.0,
                "trainer.batch_size": float(batch),
                "trainer.compute_s": 0.001 * batch,
                "trainer.iteration_s": 0.2,
                f"link.{peer}.bytes_sent": 1e5 * (k + 1),
            }
            if site == "a":
                rep[f"link.{peer}.backlog_bytes"] = 41 * M / 8 * 0.05 * k
                rep[f"link.{peer}.backlog_s"] = 0.05 * k
                rep[f"link.{peer}.rate_bps"] = 100 * M  # paced far above what it carried
            else:  # b received from a
                rep[f"link.{peer}.rx_bytes"] = 30 * M / 8 * 0.04 * k
                rep[f"link.{peer}.rx_s"] = 0.04 * k
                rep[f"link.{peer}.rx_n"] = float(k)
                rep[f"link.{peer}.rx_fast"] = 0.0
            policy.observe(site, rep, now)
        policy.decide(now)
    assert policy.policy is not None
    assert set(policy.policy.links.rx_windows()) == {"a>b"}
    assert policy.policy.links._paced["a>b"][0] == 100 * M  # the sender's pacing rate, by direction
    assert policy.policy.links.delivery_bps(now) == pytest.approx(30 * M)
    assert policy.policy.bandwidth.estimate_bps == pytest.approx(30 * M)


def test_every_link_table_is_bounded_and_forgets_the_stalest(monkeypatch: pytest.MonkeyPatch) -> None:
    """Link names come off the wire: each table (rates while sending, delivery, receiver tails) holds at
    most MAX_LINKS, and a new link pushes out the one reported longest ago."""
    import scheduler.control.link_rate as link_rate

    monkeypatch.setattr(link_rate, "MAX_LINKS", 3)
    lr = LinkRates(_cfg())
    for i in range(5):
        name = f"s{i}>r"
        lr.observe(name, bytes_sent=0.0, busy_s=0.0, now=float(i))
        lr.observe_backlog(name, nbytes=0.0, seconds=0.0, now=float(i))
        lr.observe_rx(name, nbytes=0.0, seconds=0.0, now=float(i))
    for table in (lr._links, lr._delivery, lr._rx):
        assert sorted(table) == ["s2>r", "s3>r", "s4>r"]


def test_a_timed_probe_train_measures_a_link_whose_tails_are_all_fast() -> None:
    lr = LinkRates(_cfg())
    rx = lr._rx
    # every tail of the job's messages on a>b crossed too fast to time: the direction is left out
    lr.observe_rx("a>b", nbytes=0, seconds=0, now=0.0, n=0, fast=0)
    lr.observe_rx("a>b", nbytes=0, seconds=0, now=0.5, n=0, fast=5)
    assert rx["a>b"].judged(0.5, 1.0)[0] == "fast" and lr.delivery_bps(0.5) is None
    # a train sized to be timed reads the link: it counts, the fast tails notwithstanding
    lr.observe_probe("a>b", nbytes=0, seconds=0, now=0.0)
    assert lr.observe_probe("a>b", nbytes=250_000, seconds=0.02, now=0.75) == pytest.approx(100 * M)
    assert lr.delivery_bps(0.75) == pytest.approx(100 * M)
    # a report without a new train measures nothing; the train's rate ages out after link_probe_max_age_s
    assert lr.observe_probe("a>b", nbytes=250_000, seconds=0.02, now=1.0) is None
    assert lr.delivery_bps(0.75 + lr.cfg.link_probe_max_age_s + 0.01) is None
    # trains are off with link_probe_max_age_s 0
    off = LinkRates(_cfg(link_probe_max_age_s=0.0))
    off.observe_probe("a>b", nbytes=0, seconds=0, now=0.0)
    off.observe_probe("a>b", nbytes=250_000, seconds=0.02, now=0.75)
    assert off.delivery_bps(0.8) is None


def test_the_receivers_median_wins_over_an_older_train() -> None:
    lr = LinkRates(_cfg())
    lr.observe_probe("a>b", nbytes=0, seconds=0, now=0.0)
    lr.observe_probe("a>b", nbytes=250_000, seconds=0.02, now=0.25)  # 100 Mbit/s, then the link drops
    _windows(lr, "a>b", [30, 30, 30], 0.25, rx=True)
    assert lr.delivery_bps(1.0) == pytest.approx(30 * M)


def test_probe_trains_arrive_from_the_receiving_gateways_keys() -> None:
    policy = AdaptivePolicy(("a", "b"), _cfg(bw_initial_bps=200 * M), PowerLawConvergence())
    now = 0.0
    for k in range(16):  # b times a train from a every second; every tail of the job's messages is fast
        now = 0.25 * k
        for site, peer in (("a", "b"), ("b", "a")):
            batch = 8 + k % 3 * 8
            rep = {
                "frontier": float(k),
                "cfg.density": 0.01,
                "cfg.staleness": 1.0,
                "trainer.iteration": float(k),
                "trainer.params": 1e6,
                "trainer.world_size": 1.0,
                "trainer.batch_size": float(batch),
                "trainer.compute_s": 0.001 * batch,
                "trainer.iteration_s": 0.2,
                f"link.{peer}.bytes_sent": 1e5 * (k + 1),
            }
            if site == "b":
                rep[f"link.{peer}.rx_bytes"] = 0.0
                rep[f"link.{peer}.rx_s"] = 0.0
                rep[f"link.{peer}.rx_n"] = 0.0
                rep[f"link.{peer}.rx_fast"] = float(3 * k)
                rep[f"link.{peer}.probe_bytes"] = 60 * M / 8 * 0.03 * (k // 4)
                rep[f"link.{peer}.probe_s"] = 0.03 * (k // 4)
            policy.observe(site, rep, now)
        policy.decide(now)
    assert policy.policy is not None
    assert policy.policy.links.delivery_bps(now) == pytest.approx(60 * M)
    assert policy.policy.bandwidth.estimate_bps == pytest.approx(60 * M)  # not the 200 Mbit/s prior
    with pytest.raises(RemoteProtocolError):
        LinkRates(_cfg()).observe_probe("a>b", nbytes=-1, seconds=0, now=0.0)
    with pytest.raises(ConfigError):
        _cfg(link_probe_max_age_s=-1.0)
