"""Per-iteration link times (seed 002's T_flow_i) as the node measures them."""

from __future__ import annotations

import pytest

from gateways.sending.config import DeliveryConfig
from gateways.sending.link_times import LinkTimes, union_length
from wanrt.errors import ConfigError


def _send(lt: LinkTimes, peer: str, seq: int, iteration: int, now: float) -> None:
    lt.queued(peer, seq, iteration)
    lt.started(peer, seq, now)


def test_union_length() -> None:
    assert union_length([]) == 0.0
    assert union_length([(0.0, 1.0), (0.5, 2.0), (3.0, 4.0)]) == pytest.approx(3.0)
    assert union_length([(3.0, 4.0), (0.0, 10.0)]) == pytest.approx(10.0)


def test_cumulative_acks_and_forced_report_after_settle() -> None:
    lt = LinkTimes(settle=2)
    _send(lt, "b", 0, 5, now=1.0)
    _send(lt, "c", 0, 5, now=1.0)
    _send(lt, "b", 2, 5, now=1.5)  # EDF: seq 2 went before seq 1
    _send(lt, "b", 1, 6, now=1.6)
    assert lt.acked_through("b", 0, now=1.2) == 1
    assert lt.acked_through("b", 2, now=2.0) == 2
    assert lt.ready(None, frontier=6, now=3.0) == []  # c still owes an ack and 5 is not settled yet
    ready = lt.ready(None, frontier=7, now=3.0)
    # b: [1.0, 1.2] and [1.5, 2.0] -> 0.7 of busy time; c never acked: elapsed since its start
    # then 6: every message acknowledged and no round open, so it goes at once
    assert ready == [(5, {"b": pytest.approx(0.7), "c": pytest.approx(2.0)}), (6, {"b": pytest.approx(0.4)})]
    _send(lt, "b", 3, 8, now=3.5)
    lt.drop_peer("b")
    assert lt.ready(None, frontier=12, now=4.0) == []  # b's iteration 8 measurement went with its link
    _send(lt, "c", 9, 4, now=5.0)  # late message of a reported iteration: not measured
    assert lt.ready(None, frontier=20, now=6.0) == []


def test_reported_as_soon_as_acknowledged_and_no_round_open() -> None:
    lt = LinkTimes(settle=4)
    _send(lt, "b", 0, 3, now=0.0)
    assert lt.ready(None, frontier=3, now=0.5) == []  # not acknowledged yet
    lt.acked_through("b", 0, now=1.0)
    assert lt.ready(3, frontier=3, now=1.0) == []  # a round of iteration 3 is still open here
    assert lt.ready(4, frontier=3, now=1.0) == [(3, {"b": pytest.approx(1.0)})]


def test_waiting_for_other_inputs_is_not_link_time() -> None:
    """Layer 0 goes out at t=0 and is acked at 1; layer 1 can only go at t=5 (the round waited for another
    site's partial) and is acked at 6: the link was busy for 2 s, not 6."""
    lt = LinkTimes(settle=4)
    _send(lt, "b", 0, 0, now=0.0)
    lt.acked_through("b", 0, now=1.0)
    _send(lt, "b", 1, 0, now=5.0)
    lt.acked_through("b", 1, now=6.0)
    assert lt.ready(None, frontier=0, now=6.0) == [(0, {"b": pytest.approx(2.0)})]


def test_queued_but_not_started_keeps_the_iteration_open() -> None:
    lt = LinkTimes(settle=4)
    _send(lt, "b", 0, 2, now=0.0)
    lt.queued("b", 1, 2)  # still in the EDF queue behind other traffic
    lt.acked_through("b", 0, now=1.0)
    assert lt.ready(None, frontier=2, now=1.0) == []
    lt.started("b", 1, now=1.5)
    lt.acked_through("b", 1, now=2.0)
    assert lt.ready(None, frontier=2, now=2.0) == [(2, {"b": pytest.approx(1.5)})]


def test_busy_time_and_bytes_are_summed_per_peer_for_the_same_iterations() -> None:
    lt = LinkTimes(settle=3)
    lt.queued("b", 0, iteration=0, nbytes=1000)
    lt.queued("b", 1, iteration=0, nbytes=500)
    lt.started("b", 0, 1.0)
    lt.started("b", 1, 1.2)
    lt.acked_through("b", 1, 1.5)
    lt.queued("b", 2, iteration=1, nbytes=4000)  # not yet acknowledged: not counted yet
    lt.started("b", 2, 1.6)
    assert [i for i, _ in lt.ready(None, frontier=1, now=1.7)] == [0]
    assert lt.busy_s["b"] == pytest.approx(0.5)
    assert lt.busy_bytes["b"] == 1500  # iteration 1's bytes wait for its time
    lt.acked_through("b", 2, 2.0)
    lt.ready(None, frontier=2, now=2.0)
    assert lt.busy_s["b"] == pytest.approx(0.9)
    assert lt.busy_bytes["b"] == 5500


def test_peak_is_the_fastest_message_of_the_last_reported_iteration() -> None:
    lt = LinkTimes(settle=3)
    lt.queued("b", 0, iteration=0, nbytes=1_000_000)
    lt.queued("b", 1, iteration=0, nbytes=1000)
    lt.started("b", 0, 0.0)
    lt.acked_through("b", 0, 0.2)  # 8 Mbit in 0.2 s
    lt.started("b", 1, 0.3)
    lt.acked_through("b", 1, 0.34)  # a small message: its round trip dominates
    lt.ready(None, frontier=1, now=0.4)
    assert lt.peak_bps["b"] == pytest.approx(40e6)


# -- delivery while backlogged: span minus the link's round trip ------------------------------------------


def _msg(lt: LinkTimes, seq: int, iteration: int, nbytes: int, start: float, ack: float) -> None:
    lt.queued("b", seq, iteration, nbytes)
    lt.started("b", seq, start)
    lt.acked_through("b", seq, ack)


def test_a_large_message_is_delivered_in_its_span_minus_the_round_trip() -> None:
    lt = LinkTimes(settle=2)
    _msg(lt, 0, 1, 2_000, start=0.0, ack=0.040)  # a small message: the round trip
    _msg(lt, 1, 1, 500_000, start=0.100, ack=0.180)  # 40 ms of bytes at 100 Mbit/s, plus 40 ms
    lt.ready(None, frontier=1, now=0.2)
    assert lt.rtprop("b") == pytest.approx(0.040)
    assert lt.backlog_s["b"] == pytest.approx(0.040)
    assert lt.backlog_bytes["b"] == 500_000
    # the busy time keeps the round trips (the link-rate floor's lower bound)
    assert lt.busy_s["b"] == pytest.approx(0.040 + 0.080)


def test_overlapping_messages_count_the_union_of_their_delivery() -> None:
    lt = LinkTimes(settle=2)
    _msg(lt, 0, 1, 100, start=0.0, ack=0.040)
    lt.queued("b", 1, 1, 300_000)
    lt.queued("b", 2, 1, 300_000)
    lt.started("b", 1, 0.100)
    lt.started("b", 2, 0.101)  # written behind the first: the link carries them one after the other
    lt.acked_through("b", 1, 0.164)
    lt.acked_through("b", 2, 0.188)
    lt.ready(None, frontier=1, now=0.2)
    assert lt.backlog_s["b"] == pytest.approx(0.048)  # [0.100, 0.124] ∪ [0.101, 0.148]
    assert lt.backlog_bytes["b"] == 600_000


def test_no_sample_without_a_round_trip_small_messages_or_a_measurable_net_time() -> None:
    lt = LinkTimes(settle=2)
    _msg(lt, 0, 1, 250_000, start=0.0, ack=0.060)  # no small message yet: no round trip known
    lt.ready(None, frontier=1, now=0.1)
    assert "b" not in lt.backlog_s and lt.rtprop("b") is None
    _msg(lt, 1, 2, 1_000, start=0.2, ack=0.240)
    _msg(lt, 2, 2, 30_000, start=0.3, ack=0.350)  # below min_bytes: lost in the round trip's jitter
    _msg(lt, 3, 2, 250_000, start=0.4, ack=0.450)  # 10 ms over the round trip: the link's burst
    lt.ready(None, frontier=2, now=0.5)
    assert "b" not in lt.backlog_s


def test_the_round_trip_is_a_windowed_minimum_that_forgets() -> None:
    lt = LinkTimes(settle=2, delivery=DeliveryConfig(rtprop_window_s=1.0))
    _msg(lt, 0, 1, 100, start=0.0, ack=0.040)
    _msg(lt, 1, 1, 100, start=0.5, ack=0.560)  # longer: the minimum holds
    assert lt.rtprop("b") == pytest.approx(0.040)
    _msg(lt, 2, 1, 100, start=1.5, ack=1.580)  # the minimum is older than the window: the path changed
    assert lt.rtprop("b") == pytest.approx(0.080)
    _msg(lt, 3, 1, 200_000, start=2.0, ack=2.100)  # large messages never set the round trip
    assert lt.rtprop("b") == pytest.approx(0.080)
    lt.drop_peer("b")
    assert lt.rtprop("b") is None


def test_disabled_reports_nothing() -> None:
    lt = LinkTimes(settle=2, delivery=DeliveryConfig(enabled=False))
    _msg(lt, 0, 1, 100, start=0.0, ack=0.040)
    _msg(lt, 1, 1, 500_000, start=0.1, ack=0.180)
    lt.ready(None, frontier=1, now=0.2)
    assert lt.backlog_s == {} and lt.busy_s["b"] > 0


def test_delivery_config_is_validated() -> None:
    with pytest.raises(ConfigError):
        DeliveryConfig(rtprop_max_bytes=128 << 10)  # above min_bytes: a sample could set its own floor
    with pytest.raises(ConfigError):
        DeliveryConfig(min_net_s=0.0)
