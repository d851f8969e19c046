"""Timed probe trains: the train size that times a link, the bound a too-fast train proves, when a
receiver asks for one, and that a train sized this way is timed by the receiver's tail dispersion."""

from __future__ import annotations

import dataclasses

import pytest

from gateways.sending.config import DeliveryConfig
from gateways.sending.probe_trains import ProbeTrains, fast_bound_bps, train_bytes
from gateways.sending.rx_dispersion import RxDispersion
from wanrt.errors import ConfigError, LocalProtocolError
from wanrt.protocol.peer.probe_train import MAX_PROBE_BYTES, ProbeRequest, ProbeTrain

M = 1e6
SEG = 1448
CFG = DeliveryConfig()


def _arrive(rx: RxDispersion, t: float, nbytes: int, rate: float, burst: int = 0) -> float:
    """``nbytes`` arrive: a token bucket's ``burst`` at once, then the rest at ``rate`` in TCP segments."""
    if burst:
        rx.read(t, burst)
    left = nbytes - burst
    while left > 0:
        n = min(SEG, left)
        t += 8.0 * n / rate
        rx.read(t, n)
        left -= n
    return t


@pytest.mark.parametrize("rate", [5 * M, 30 * M, 100 * M, 400 * M])
def test_a_train_sized_for_a_rate_times_every_link_up_to_its_gain(rate: float) -> None:
    cfg = dataclasses.replace(CFG, probe_max_bytes=MAX_PROBE_BYTES)
    size = train_bytes(rate, cfg)
    # its tail (half) lasts the margin over the threshold at gain × rate ...
    top = cfg.probe_gain * rate
    if size > cfg.probe_min_bytes:
        assert (size / 2) * 8 / top == pytest.approx(cfg.probe_tail_factor * cfg.rx_min_tail_s, rel=1e-3)
    # ... so at any link rate up to that (and a 20 ms burst at the head), the receiver times the link
    for link in (0.3 * rate, rate, top):
        rx = RxDispersion(cfg)
        rx.read(0.0, 1)
        burst = min(int(link * 0.02 / 8), size // 3)
        _arrive(rx, 1.0, size, link, burst)
        got = rx.message(rx.total, size)
        assert got is not None, (rate, link)
        assert 8 * got[0] / got[1] == pytest.approx(link, rel=0.03)


def test_train_sizes_are_clamped_and_a_too_fast_train_proves_its_bound() -> None:
    assert train_bytes(1.0, CFG) == CFG.probe_min_bytes
    assert train_bytes(1e12, CFG) == CFG.probe_max_bytes
    size = train_bytes(30 * M, CFG)
    rx = RxDispersion(CFG)
    rx.read(0.0, 1)
    _arrive(rx, 1.0, size, 500 * M)  # the link is far faster than the train was sized for
    assert rx.message(rx.total, size) is None and rx.latest_fast
    bound = fast_bound_bps(size, CFG)
    assert 30 * M * CFG.probe_gain < bound < 500 * M  # a true lower bound, above what the train tested
    # the next train is sized for that bound: at least gain × factor larger
    assert train_bytes(bound, CFG) >= CFG.probe_gain * CFG.probe_tail_factor * size * 0.99


def _link(cfg: DeliveryConfig = CFG) -> tuple[ProbeTrains, RxDispersion]:
    probes, rx = ProbeTrains(cfg), RxDispersion(cfg)
    assert probes.due("a", rx, 0.0) is None  # the link's first interval decides
    return probes, rx


def test_a_link_whose_messages_were_not_timed_is_probed_once_per_interval() -> None:
    probes, rx = _link()
    rx.fast += 5  # the job's messages all crossed too fast to time
    rx.total += 500_000
    due = probes.due("a", rx, 1.0)
    assert due is not None and due[1] == train_bytes(CFG.probe_initial_bps, CFG)
    assert probes.due("a", rx, 2.5) is None  # one train outstanding per link
    probes.train("a", due[0], due[1], (due[1] // 2, 0.5), False, 2.6)  # timed: 8·S/2 / 0.5 s
    assert (probes.trains, probes.probe_bytes["a"], probes.probe_s["a"]) == (1, due[1] // 2, 0.5)
    rx.samples += 1  # the train's own tail counts in the receiver's counters, but is not the job's
    rx.total += due[1]
    assert probes.due("a", rx, 3.0) is None  # only the train's bytes came: the plan left the link
    rx.total += 500_000
    nxt = probes.due("a", rx, 4.0)
    assert nxt is not None  # the job's traffic still timed nothing
    assert nxt[1] == train_bytes(8 * (due[1] // 2) / 0.5, CFG)  # sized from what the train measured


def test_no_train_while_the_jobs_own_messages_are_timed() -> None:
    probes, rx = _link()
    rx.samples, rx.fast, rx.last, rx.total = 3, 1, (100_000, 0.03), 600_000
    assert probes.due("a", rx, 1.0) is None
    rx.fast += 4  # now mostly too fast: the scheduler's censored median would say "fast"
    rx.total += 600_000
    assert probes.due("a", rx, 2.0) is not None


def test_a_too_fast_train_grows_the_next_and_an_unanswered_one_is_asked_again() -> None:
    probes, rx = _link()
    rx.total += 300_000
    first = probes.due("a", rx, 1.0)
    assert first is not None
    probes.train("a", first[0], first[1], None, True, 1.2)  # its tail crossed too fast to time
    rx.total += first[1]
    assert probes.trains == 0 and probes.fast_trains == 1 and "a" not in probes.probe_bytes
    rx.total += 300_000
    second = probes.due("a", rx, 2.0)
    assert second is not None and second[1] >= 1.8 * first[1]
    assert probes.due("a", rx, 3.0) is None  # outstanding
    rx.total += 300_000
    third = probes.due("a", rx, 2.0 + 4 * CFG.probe_interval_s)  # never answered: asked again
    assert third is not None and third[0] != second[0]


def test_the_sender_bounds_what_a_peer_may_ask_for() -> None:
    probes = ProbeTrains(CFG)
    assert probes.may_send("b", 200_000, 0.0)
    assert not probes.may_send("b", 200_000, 0.1)  # one per half interval per peer
    assert probes.may_send("c", 200_000, 0.1)
    assert not probes.may_send("b", CFG.probe_max_bytes + 1, 5.0)
    off = ProbeTrains(dataclasses.replace(CFG, probe_enabled=False))
    assert not off.may_send("b", 200_000, 0.0)
    assert off.due("b", RxDispersion(CFG), 0.0) is None and off.due("b", RxDispersion(CFG), 9.0) is None


def test_wire_messages_are_bounded_and_round_trip() -> None:
    train = ProbeTrain(7, 1000)
    header, buffers = train.to_wire()
    assert bytes(buffers[0]) == bytes(1000)
    assert ProbeTrain.from_wire(header, buffers, peer="a") == train
    with pytest.raises(LocalProtocolError):
        ProbeTrain.from_wire(header, [], peer="a")
    with pytest.raises(LocalProtocolError):
        ProbeTrain.from_wire(header, [memoryview(bytes(MAX_PROBE_BYTES + 1))], peer="a")
    with pytest.raises(LocalProtocolError):
        ProbeRequest(1, MAX_PROBE_BYTES + 1)
    with pytest.raises(LocalProtocolError):
        ProbeRequest(1, 0)


def test_probe_knobs_are_validated() -> None:
    for bad in (
        {"probe_gain": 0.5},
        {"probe_interval_s": 0.0},
        {"probe_min_bytes": 1},  # below rx_min_bytes: not timeable at all
        {"probe_max_bytes": 8 << 20},
    ):
        with pytest.raises(ConfigError):
            dataclasses.replace(CFG, **bad)  # type: ignore[arg-type]
