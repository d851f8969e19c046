"""The daemon's small sans-IO helpers: join iterations, model adoption, the trainer ledger, link times, and
the /metrics rendering."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gateways.membership.job_model import JobModelState, ModelSignature
from gateways.membership.joining import LinkInfo, initial_live, join_iteration, lost_on_suspect
from gateways.membership.trainer_ledger import TrainerLedger
from gateways.rounds.actions import RoundClosed
from gateways.sending.link_times import LinkTimes
from gateways.stats import GatewayStats, render_prometheus
from tests.gateways.harness import make_payload
from wanrt.errors import RemoteProtocolError
from wanrt.protocol import Aggregate

# -- membership -------------------------------------------------------------------------------------------


def test_both_ends_compute_the_same_join_iteration() -> None:
    starting = LinkInfo(-1, True)
    assert join_iteration(starting, starting, margin=3) == 0  # the job starts: everyone from 0
    running, fresh = LinkInfo(41, False), LinkInfo(-1, True)
    # the fresh gateway starts its engine at what its peer uses for it
    assert join_iteration(fresh, running, margin=3) == join_iteration(running, fresh, margin=3) == 45
    # after its first link, a rejoining gateway announces where it joined: everyone else uses that
    rejoined = LinkInfo(46, False, join_at=45)
    assert join_iteration(LinkInfo(60, False), rejoined, margin=3) == 45
    # two running gateways whose link broke: symmetric
    x, y = LinkInfo(70, False), LinkInfo(72, False)
    assert join_iteration(x, y, margin=3) == join_iteration(y, x, margin=3) == 76


def test_link_info_round_trip_and_bad_values() -> None:
    info = LinkInfo(5, False, 3, ("b", "a")).to_info()
    assert LinkInfo.parse(info, peer="x") == LinkInfo(5, False, 3, ("a", "b"))
    assert initial_live("c", "a", LinkInfo.parse(info, peer="a"), "abcd") == {"a", "b", "c"}
    assert initial_live("c", "a", LinkInfo(5, False), "abcd") == set("abcd")
    for bad in (
        {"frontier": "5", "fresh": False},
        {"frontier": 5},
        {"frontier": 5, "fresh": False, "join_at": -1},
    ):
        with pytest.raises(RemoteProtocolError):
            LinkInfo.parse(bad, peer="x")
    assert lost_on_suspect(link_up=False) and not lost_on_suspect(link_up=True)


# -- model signature --------------------------------------------------------------------------------------


def _sig(model: bytes, site: str) -> ModelSignature:
    return ModelSignature(model, 2, 1, b"12345678" * 2, site)


def test_gateways_converge_on_one_model_and_a_running_job_keeps_its_own() -> None:
    a, b = JobModelState(), JobModelState()
    a.offer(_sig(b"A", "a"), established=False)
    b.offer(_sig(b"B", "b"), established=False)
    # they exchange: both end with the smaller site's model, whatever the order
    assert b.offer(_sig(b"A", "a"), established=False) == "replaced"
    assert a.offer(_sig(b"B", "b"), established=False) == "kept"
    assert a.current == b.current == _sig(b"A", "a")
    # an established model (rounds ran with it) is never replaced by a newcomer, even a smaller name
    a.establish()
    assert a.offer(_sig(b"Z", "0"), established=False) == "kept"
    assert a.conflicts[-1] == ("a", "0")
    fresh = JobModelState()
    fresh.offer(_sig(b"Z", "0"), established=False)
    assert fresh.offer(_sig(b"A", "a"), established=True) == "replaced"
    info = a.info()
    assert ModelSignature.from_info(info, site=None, peer="a") == a.current
    with pytest.raises(RemoteProtocolError):
        ModelSignature.from_info({"model": b"x"}, site=None, peer="a")
    assert ModelSignature.from_info({}, site="a", peer="a") is None


# -- trainer ledger ---------------------------------------------------------------------------------------


def test_pushes_are_acknowledged_once_counted_and_resends_are_recognised() -> None:
    led = TrainerLedger("a", join_at=0)
    p = make_payload("a", 0, 1)
    v = led.on_push(0, 1, p)
    assert v.push == (0, 1, p) and not v.acks
    assert led.on_push(0, 1, p).push is None  # resent while pending: already in the engine
    assert led.on_deliver(1, (("a", 0), ("b", 0))) == ((0, 1),)
    assert led.on_push(0, 1, p).acks == ((0, 1),)  # resent after its ack was lost: acknowledged again
    led.on_push(3, 1, make_payload("a", 3, 1))
    with pytest.raises(RemoteProtocolError):
        led.on_push(2, 1, make_payload("a", 2, 1))  # older than the newest push, never seen


def test_after_a_restart_resent_pushes_are_settled_by_outcomes() -> None:
    led = TrainerLedger("d", join_at=20)
    old = {it: make_payload("d", it, 0) for it in (16, 17, 18)}
    for it, p in old.items():
        assert led.on_push(it, 0, p) == led.on_push(it, 0, p).__class__()  # waits for an outcome
    assert [it for it, _ in led.held(0)] == [16, 17, 18]
    # a peer reports 16 and 17 counted (they were, before the crash); 18 was not
    acks = led.on_outcome(0, 10, 20, (("d", 16), ("d", 17)))
    assert acks == ((16, 0), (17, 0))
    assert [it for it, _ in led.held(0)] == [18]
    new = make_payload("d", 20, 0)
    v = led.on_push(20, 0, new)
    assert v.push is not None and v.push[0] == 20
    dense = v.push[2].to_dense()
    np.testing.assert_array_equal(dense, new.to_dense() + old[18].to_dense())  # folded, nothing lost
    assert not led.held(0)
    assert led.on_push(18, 0, old[18]).push is None  # resent again: already folded
    assert led.on_deliver(0, (("d", 20),)) == ((20, 0), (18, 0))
    assert led.stats.recovered_counted == 2 and led.stats.recovered_folded == 1


def test_a_resent_push_sent_again_before_its_carrier_is_folded_once() -> None:
    """A resent push settled as not counted waits in the carry for the trainer's next push; if the trainer
    sends it once more meanwhile (a second reconnect to the restarted gateway, or the link's re-send racing
    its own queued copy of the newest push), it must not go into the carry a second time: folded twice,
    its gradient would count twice, under one id."""
    led = TrainerLedger("d", join_at=20)
    old = make_payload("d", 18, 0)
    led.on_push(18, 0, old)
    assert led.on_outcome(0, 10, 20, ()) == ()  # not counted by the peer: carried
    assert [it for it, _ in led.held(0)] == [18]
    v = led.on_push(18, 0, old)  # the same push once more
    assert v.push is None and not v.acks
    assert [it for it, _ in led.held(0)] == [18]
    new = make_payload("d", 20, 0)
    v = led.on_push(20, 0, new)
    assert v.push is not None and led.covers(20, 0) == (18,)
    np.testing.assert_array_equal(v.push[2].to_dense(), new.to_dense() + old.to_dense())
    assert led.on_deliver(0, (("d", 20),)) == ((20, 0), (18, 0))
    assert led.stats.recovered_folded == 1 and led.stats.resent_ignored == 1


def test_each_push_gets_one_answer_and_unacked_aggregates_are_kept() -> None:
    led = TrainerLedger("a", join_at=0)
    assert led.answer(3, 1) and not led.answer(3, 1)
    agg = Aggregate("j", 3, 1, 0, "a", make_payload("a", 3, 1), ("a",))
    led.retain(agg)
    assert led.unacked_aggregates() == [agg]
    assert led.aggregate_acked(3, 1) and not led.unacked_aggregates()
    assert led.shape(1) is None
    led.on_push(0, 1, make_payload("a", 0, 1))
    assert led.shape(1) == (make_payload("a", 0, 1).dense_len, make_payload("a", 0, 1).block_size)


# -- link times -------------------------------------------------------------------------------------------


# -- metrics ----------------------------------------------------------------------------------------------


def test_prometheus_rendering() -> None:
    st = GatewayStats("a", ["b"])
    st.round_closed(RoundClosed(4, 0, (("a", 3), ("a", 4), ("b", 4)), (), ("b",), 0.1))
    st.peers["b"].counters.bytes_sent = 123
    status = {
        "site": "a",
        "counters": st.counters(),
        "peers": {
            "b": {
                "state": "up",
                "live": True,
                "rate_bps": 1e6,
                "base_rate_bps": 1e6,
                "straggler": False,
                "queue_items": 2,
                "queue_bytes": 300,
            }
        },
        "frontier": 4,
        "open_rounds": 1,
        "rates": {"stragglers": [], "reallocations": 0},
        "trainer": {"connected": True},
    }
    text = render_prometheus(status)
    assert 'wanrt_gateway_bytes_sent_total{site="a",peer="b"} 123' in text
    assert 'wanrt_gateway_late_contributions_total{site="a"} 1' in text
    assert 'wanrt_gateway_late_children_total{site="a"} 1' in text
    assert "# TYPE wanrt_gateway_peer_up gauge" in text
    assert not math.isnan(float(text.splitlines()[2].split()[-1]))


def test_bookkeeping_stays_bounded_against_a_misbehaving_trainer_or_peer() -> None:
    from gateways.membership.trainer_ledger import MAX_RESENT_PER_LAYER
    from gateways.sending.link_times import MAX_OUTSTANDING
    from wanrt.errors import LimitExceeded

    led = TrainerLedger("d", join_at=10_000)
    p = make_payload("d", 0, 0)
    for it in range(MAX_RESENT_PER_LAYER):
        led.on_push(it, 0, p)
    with pytest.raises(LimitExceeded):
        led.on_push(MAX_RESENT_PER_LAYER, 0, p)
    lt = LinkTimes(settle=1)
    for seq in range(MAX_OUTSTANDING + 10):  # a peer that never acknowledges
        lt.queued("b", seq, 1)
        lt.started("b", seq, now=0.0)
    assert lt.acked_through("b", MAX_OUTSTANDING + 10, now=1.0) == MAX_OUTSTANDING


def test_trainer_config_updates_name_the_bad_key() -> None:
    from wanrt.errors import ConfigError
    from wanrt.protocol import ConfigUpdate
    from wanrt.protocol.job_settings import TrainerSettings

    settings = TrainerSettings.from_wire({"density": 0.05, "staleness": 0, "batch_size": 64})
    msg = ConfigUpdate(settings.to_wire(), 12)
    assert msg.values == {"density": 0.05, "staleness": 0, "batch_size": 64} and msg.effective_iteration == 12
    for values, key in (
        ({"lr": 0.1}, "lr"),
        ({"density": 0}, "density"),
        ({"density": True}, "density"),
        ({"staleness": 1.5}, "staleness"),
        ({"batch_size": 0}, "batch_size"),
        ({}, "values"),
    ):
        with pytest.raises(ConfigError) as err:
            TrainerSettings.from_wire(values)
        assert err.value.fields["key"] == key


def test_a_site_that_never_contributed_is_warned_about_only_after_the_start_grace() -> None:
    """Issue 21: every normal start logged "rounds complete without site a (3 in a row): is its trainer
    running?" (trainers are launched seconds apart). A site that never took part is only warned about
    once it has been missing for the grace; one that did, after 3 rounds in a row as before."""
    st = GatewayStats("a", ["b"])

    Sites = tuple[str, ...]

    def closed(it: int, now: float, present: Sites, missing: Sites) -> list[tuple[str, int]]:
        return st.round_closed(
            RoundClosed(it, 0, tuple((s, it) for s in present), missing, (), 0.1), now, absent_grace_s=30.0
        )

    assert [closed(i, float(i), ("a",), ("b",)) for i in range(10)] == [[]] * 10  # b still starting
    assert closed(10, 31.0, ("a",), ("b",)) == [("b", 11)]  # missing 31 s: now worth saying
    assert closed(11, 32.0, ("a",), ("b",)) == []  # said once
    assert closed(12, 33.0, ("a", "b"), ()) == [] and "b" not in st.missing_streak
    assert [closed(13 + i, 34.0 + i, ("a",), ("b",)) for i in range(3)] == [[], [], [("b", 3)]]


def test_a_warning_about_a_site_that_contributes_again_leaves_status() -> None:
    from gateways.membership.site_faults import SiteFaults

    faults = SiteFaults("a")
    assert faults.warn("b", "trainer", "rounds complete without site b (2300 in a row)", 0.0) is not None
    assert faults.warn("c", "auth", "a trainer of site c failed to authenticate", 0.0) is not None
    faults.clear_warnings("trainer", keep={"d"})
    assert [(f["site"], f["kind"]) for f in faults.status()] == [("c", "auth")]
