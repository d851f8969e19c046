"""Contribution-id sets (wanrt.protocol.peer.contrib_ids): the cached tuple means exactly what the plain
sorted tuple
means, its wire form round-trips and refuses every malformed or oversized blob before allocating, and the
"already checked" shortcut of check_message never lets through what the full check would refuse."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateways.rounds.checks import check_message
from gateways.rounds.timeline import PlanTimeline
from gateways.rounds.topology import PlanSpec
from gateways.stats import GatewayStats
from wanrt.errors import LimitExceeded, LocalProtocolError, RemoteProtocolError
from wanrt.protocol.peer.contrib_ids import (
    MAX_IDS_BLOB_BYTES,
    MAX_ROUND_IDS,
    ContribIds,
    as_ids,
    count_older,
    decode_ids,
    distinct_sites,
    encode_ids,
    id_pairs,
    intern_sites,
    iterations_of,
    merge_ids,
    missing_members,
    site_names,
)
from wanrt.protocol.peer.round_msg import RoundMsg

id_sets = st.frozensets(
    st.tuples(st.sampled_from(["a", "b", "c", "s000", "s001", "z.9"]), st.integers(0, 12)), max_size=40
)


@given(id_sets)
def test_wire_form_round_trips_and_views_agree_with_the_plain_tuple(ids: frozenset[tuple[str, int]]) -> None:
    plain = tuple(sorted(ids))
    cached = as_ids(plain)
    assert cached == plain and isinstance(cached, tuple)
    back = decode_ids(encode_ids(plain))
    assert back == plain and type(back) is ContribIds
    assert decode_ids(cached.wire()) is back  # equal blobs share one decoded value
    for view in (cached, plain):
        assert id_pairs(view) == frozenset(plain)
        assert site_names(view) == {s for s, _ in plain}
        assert distinct_sites(view) == tuple(sorted({s for s, _ in plain}))
        assert iterations_of(view, "b") == [it for s, it in plain if s == "b"]
        assert count_older(view, 6) == sum(1 for _, it in plain if it < 6)
        assert missing_members(view, ("a", "b", "q")) == tuple(
            m for m in ("a", "b", "q") if m not in {s for s, _ in plain}
        )


def test_merge_is_the_sorted_union() -> None:
    a, b = (("b", 1), ("c", 0)), (("a", 2), ("b", 1))
    merged = merge_ids(a, b)
    assert merged == (("a", 2), ("b", 1), ("c", 0)) and type(merged) is ContribIds
    assert merge_ids(merged) is merged
    assert encode_ids(merged) == b"0=c;1=b;2=a"


def test_oversized_blobs_are_refused_before_they_are_split() -> None:
    with pytest.raises(LimitExceeded):
        decode_ids(b"0=" + b"a," * MAX_ROUND_IDS + b"b")
    with pytest.raises(LimitExceeded):
        decode_ids(b"0=" + b"a" * (MAX_IDS_BLOB_BYTES + 1))
    with pytest.raises(LocalProtocolError):
        decode_ids(b"0=a;0=b")  # one group per iteration
    with pytest.raises(LocalProtocolError):
        decode_ids(b"00000000000000000000001=a")  # more digits than any counter


def _final(ids: tuple[tuple[str, int], ...], iteration: int) -> RoundMsg:
    return RoundMsg("final", iteration, 0, 1, None, ids)


def test_the_checked_shortcut_keeps_every_rule() -> None:
    sites = intern_sites(["a", "b", "c"])
    assert intern_sites({"c", "b", "a"}) is sites
    ids = decode_ids(b"3=a,b;4=c")
    kw = {"site": "a", "sites": sites, "lowest": 0, "highest": 10, "max_ids": 100}
    check_message("b", _final(ids, 4), **kw)  # the full check, remembered
    assert ids.checked_against(sites)
    check_message("b", _final(ids, 5), **kw)  # the shortcut
    with pytest.raises(RemoteProtocolError):
        check_message("b", _final(ids, 3), **kw)  # ("c", 4) is from the future of iteration 3
    other = intern_sites(["a", "b"])  # another job's site set: the full check runs and refuses "c"
    with pytest.raises(RemoteProtocolError):
        check_message("b", _final(ids, 5), **{**kw, "sites": other})
    with pytest.raises(RemoteProtocolError):  # a plain tuple out of order is still refused
        check_message("b", _final((("b", 1), ("a", 1)), 5), **kw)


def test_timelines_share_built_plans_and_follow_membership() -> None:
    spec = PlanSpec.make("tree", arity=2)
    one, two = PlanTimeline(spec, {"a", "b", "c"}), PlanTimeline(spec, {"c", "b", "a"})
    assert one.plan_for(0) is two.plan_for(0)
    one.lose("c")
    assert one.plan_for(1).members == ("a", "b")
    one.join("c", 5)
    assert one.plan_for(4).members == ("a", "b") and one.plan_for(5).members == ("a", "b", "c")


def test_stats_make_peer_entries_on_first_use() -> None:
    stats = GatewayStats("a", [])
    assert stats.peers == {}
    stats.peer_state("b", "up", 1.0)
    assert stats.peers["b"].state == "up" and stats.peer("b") is stats.peers["b"]
