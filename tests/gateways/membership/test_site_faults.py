"""Which site faults a gateway believes, forwards and tells its trainer (gateways.membership.site_faults)."""

from __future__ import annotations

from gateways.membership.site_faults import MAX_KEPT, SiteFaults
from wanrt.protocol.peer.site_fault import SiteFault


def _fault(site: str, msg: str = "another model") -> SiteFault:
    return SiteFault(site, "model", msg, {"model": b"x"})


def test_a_fault_is_taken_from_the_site_itself_once() -> None:
    f = SiteFaults("a")
    assert f.accept(_fault("b"), from_peer="b", live_peers={"b", "c"}, fatal=True)
    assert not f.accept(_fault("b", "again"), from_peer="b", live_peers={"b", "c"}, fatal=True)  # once
    notice = f.notice(_fault("b"))
    assert notice.fatal and notice.site == "b" and notice.info == {"model": b"x"}


def test_a_relay_is_believed_only_when_the_site_could_not_have_told_us() -> None:
    f = SiteFaults("a")
    assert not f.accept(_fault("b"), from_peer="c", live_peers={"b", "c"}, fatal=True)  # b is linked to us
    assert f.accept(_fault("b"), from_peer="c", live_peers={"c"}, fatal=True)  # relayed over the tree
    assert not f.accept(_fault("a"), from_peer="c", live_peers={"c"}, fatal=True)  # never about us


def test_after_the_job_ran_a_fault_is_only_a_warning() -> None:
    f = SiteFaults("a")
    f.accept(_fault("b"), from_peer="b", live_peers={"b"}, fatal=False)
    assert not f.notice(_fault("b")).fatal
    assert f.status() == [{"site": "b", "kind": "model", "message": "another model", "fatal": False}]


def test_warnings_are_rate_limited_and_replayed_to_a_new_trainer() -> None:
    f = SiteFaults("a", repeat_s=30.0)
    assert f.warn("b", "auth", "wrong secret", now=0.0) is not None
    assert f.warn("b", "auth", "wrong secret", now=10.0) is None  # a flood does not flood the log
    assert f.warn("b", "config", "other rounds", now=10.0) is not None  # another kind is news
    assert f.warn("b", "auth", "wrong secret", now=31.0) is not None
    assert [n.kind for n in f.replay()] == ["config", "auth"]  # oldest first
    for i in range(MAX_KEPT + 5):
        f.warn(f"s{i}", "auth", "x", now=100.0)
    assert len(f.replay()) == MAX_KEPT  # bounded
