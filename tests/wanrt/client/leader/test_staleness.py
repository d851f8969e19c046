import pytest

from wanrt.client.leader.staleness import StalenessTracker
from wanrt.errors import LocalProtocolError, RemoteProtocolError


def push_all(tr: StalenessTracker[str], it: int) -> None:
    for layer in range(tr.n_layers):
        tr.pushed(it, layer)


def test_bound_zero_waits_for_everything_of_this_step() -> None:
    tr: StalenessTracker[str] = StalenessTracker(2)
    push_all(tr, 0)
    assert tr.must_wait(0, 0) == [(0, 0), (0, 1)]
    tr.arrived(0, 1, "u01")
    assert tr.must_wait(0, 0) == [(0, 0)]
    tr.arrived(0, 0, "u00")
    assert tr.must_wait(0, 0) == []
    assert [(r.iteration, r.layer, r.item) for r in tr.take_ready(0)] == [(0, 0, "u00"), (0, 1, "u01")]


def test_bound_one_applies_arrived_fresh_and_defers_the_rest_exactly_one_step() -> None:
    tr: StalenessTracker[str] = StalenessTracker(3)
    push_all(tr, 0)
    tr.arrived(0, 2, "late-layer-first")  # the last layer's update is back before the step ends
    assert tr.must_wait(0, 1) == []  # nothing of iteration -1 to wait for
    assert [r.layer for r in tr.take_ready(0)] == [2]  # applied fresh (staleness 0)
    push_all(tr, 1)
    tr.arrived(1, 0, "fresh-1-0")
    # step 1 must wait for what is still missing of iteration 0, not for iteration 1
    assert tr.must_wait(1, 1) == [(0, 0), (0, 1)]
    tr.arrived(0, 1, "x")
    tr.arrived(0, 0, "y")
    assert tr.must_wait(1, 1) == []
    ready = [(r.iteration, r.layer) for r in tr.take_ready(1)]
    assert ready == [(0, 0), (0, 1), (1, 0)]  # oldest iteration first
    assert tr.outstanding() == [(1, 1), (1, 2)]


def test_updates_after_the_step_are_not_applied_early() -> None:
    tr: StalenessTracker[str] = StalenessTracker(1)
    push_all(tr, 0)
    push_all(tr, 1)
    tr.arrived(1, 0, "b")
    assert tr.take_ready(0) == []


@pytest.mark.parametrize(("it", "layer"), [(0, 5), (3, 0), (-1, 0)])
def test_gateway_cannot_send_what_was_not_pushed(it: int, layer: int) -> None:
    tr: StalenessTracker[str] = StalenessTracker(2, peer="gw")
    push_all(tr, 0)
    with pytest.raises(RemoteProtocolError) as info:
        tr.arrived(it, layer, "x")
    assert info.value.fields["peer"] == "gw"


def test_duplicate_update_is_the_gateways_fault() -> None:
    tr: StalenessTracker[str] = StalenessTracker(1)
    push_all(tr, 0)
    tr.arrived(0, 0, "a")
    with pytest.raises(RemoteProtocolError):
        tr.arrived(0, 0, "a")


def test_own_misuse_is_local() -> None:
    tr: StalenessTracker[str] = StalenessTracker(1)
    push_all(tr, 1)
    with pytest.raises(LocalProtocolError):
        tr.pushed(0, 0)
    with pytest.raises(LocalProtocolError):
        tr.pushed(1, 0)
    with pytest.raises(LocalProtocolError):
        StalenessTracker(0)
