"""A snapshot is installed at the step whose results it holds, when the step applies exactly the results up
to an iteration (the outer loop): earlier, the joining site's parameters would be a step ahead of the
others' (a restarted DiLoCo trainer's anchors were the job's of the next outer step,
tests/wanrt/client/outer/test_recoded_results_real.py). Without that bound (SparseOptimizer's steps apply
whatever is ready) it is installed at once, as before."""

from __future__ import annotations

from typing import Any

import numpy as np

from wanrt.client.leader.resync_state import ResyncState
from wanrt.client.link.api import ResyncStarted, SnapshotArrived
from wanrt.client.link.param_resync import Snapshot
from wanrt.client.site.decision import SiteUpdate
from wanrt.payload import SparsePayload


def _state() -> ResyncState:
    """Only the leader's bookkeeping is exercised: no parameters, optimizer or channel are touched."""
    none: Any = None
    return ResyncState(
        [], none, none, is_leader=True, world_size=1, block_size=16, reset_residuals=lambda: None
    )


def _update(it: int, layer: int = 0) -> SiteUpdate:
    p = SparsePayload(layer, 16, 16, np.array([0], np.int64), np.ones(16, np.float32))
    return SiteUpdate(it, layer, 3, p)


def _arrived(st: ResyncState, k: int, extras: frozenset[tuple[int, int]] = frozenset()) -> None:
    st.on_event(ResyncStarted(k - 2))
    st.on_event(SnapshotArrived(Snapshot(k, extras, [np.zeros(16, np.float32)])))


def test_snapshot_ahead_of_the_steps_bound_waits_for_the_step_that_reaches_it() -> None:
    st = _state()
    _arrived(st, 10)  # every result below iteration 10
    assert Snapshot(10, frozenset(), []).ahead_of(8) and not Snapshot(10, frozenset(), []).ahead_of(9)
    got, installed = st.take([_update(8)], upto=8)  # this step applies up to 8: the snapshot holds 9
    assert (got, installed) == ([], False) and st.holding and st.pending
    got, installed = st.take([_update(9)], upto=9)
    assert installed
    assert got == []  # 8 and 9 are in the snapshot: skipped, not applied twice
    got, installed = st.take([_update(10)], upto=10)
    assert not installed and [u.iteration for u in got] == [10]


def test_an_extra_after_the_bound_also_waits() -> None:
    st = _state()
    _arrived(st, 9, frozenset({(10, 0)}))  # below 9, and iteration 10's layer 0 too
    assert st.take([], upto=9) == ([], False)
    got, installed = st.take([_update(10, 0), _update(10, 1)], upto=10)
    assert installed and [(u.iteration, u.layer) for u in got] == [(10, 1)]


def test_without_a_bound_the_snapshot_is_installed_at_once() -> None:
    st = _state()
    _arrived(st, 10)
    got, installed = st.take([_update(8), _update(10)])
    assert installed and [u.iteration for u in got] == [10]
