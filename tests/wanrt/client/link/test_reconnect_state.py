"""The link's reconnect bookkeeping (wanrt.client.link.reconnect): bounded, and each result delivered once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import wanrt
from tests.wanrt.client.fake_link import ScriptedLink
from wanrt.client import ClientConfig, SparseOptimizer
from wanrt.client.link.api import LinkSpec
from wanrt.client.link.reconnect import Backoff, Outstanding, ReconnectPolicy, UnackedPushes
from wanrt.errors import ConfigError, LimitExceeded
from wanrt.payload import SparsePayload


def _p(layer: int = 0) -> SparsePayload:
    return SparsePayload.from_dense_blocks(layer, np.ones(32, np.float32), np.arange(1), 16)


def test_backoff_doubles_to_the_cap_and_gives_up() -> None:
    b = Backoff(ReconnectPolicy(initial_s=0.1, max_s=0.4, give_up_s=10.0), now=0.0)
    assert [b.delay(1.0) for _ in range(4)] == [0.1, 0.2, 0.4, 0.4]
    assert b.delay(9.9) == pytest.approx(0.1)  # never past the give-up time
    assert b.delay(10.0) is None


@pytest.mark.parametrize("kw", [{"initial_s": 0.0}, {"initial_s": 2.0, "max_s": 1.0}, {"give_up_s": -1.0}])
def test_policy_is_validated(kw: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        ReconnectPolicy(**kw)


def test_unacked_pushes_go_oldest_first_and_stay_bounded() -> None:
    u = UnackedPushes(limit=4)
    for it, layer in ((3, 0), (2, 1), (2, 0)):
        u.note(it, layer, _p(layer))
    assert u.ack(3, 0) and not u.ack(3, 0)
    assert [(it, layer) for it, layer, _ in u.pending()] == [(2, 0), (2, 1)]
    u.note(2, 0, _p())  # a re-send of the same key replaces it
    assert len(u) == 2
    for it in range(4, 6):
        u.note(it, 0, _p())
    with pytest.raises(LimitExceeded):
        u.note(9, 0, _p())  # a gateway that acknowledges nothing: fail, do not grow


def test_a_result_is_delivered_once_held_when_early_and_dropped_when_repeated() -> None:
    o = Outstanding(limit=8)
    assert o.pushed(0, 0) is None and o.pushed(0, 1) is None
    assert o.result(0, 0, "r00") == "r00"
    assert o.result(0, 0, "again") is None and o.duplicates == 1  # a reconnect brought it twice
    assert o.result(5, 0, "r50") is None and o.early == 1  # before its push: held
    assert o.pushed(5, 0) == "r50"  # delivered as the push's answer, not waited for
    assert o.result(5, 0, "r50 again") is None and o.duplicates == 2
    assert len(o) == 1  # (0, 1) still waits


def test_a_layer_of_the_iteration_being_pushed_is_held_not_taken_for_a_repeat() -> None:
    """Layers go last to first; a round that closed without this site (x-order, a quorum that went on)
    can answer layer 0 while layer 2 is the only one pushed: that result is the answer to come, not a
    duplicate (dropping it left the training loop waiting until update_deadline_s)."""
    o = Outstanding()
    assert o.pushed(3, 2) is None
    assert o.result(3, 0, "r30") is None and o.duplicates == 0 and o.early == 1
    assert o.pushed(3, 1) is None
    assert o.pushed(3, 0) == "r30"
    assert o.result(3, 0, "r30 again") is None and o.duplicates == 1


def test_rounds_before_a_join_stop_waiting() -> None:
    o = Outstanding()
    for it in range(10, 14):
        o.pushed(it, 0)
    assert o.below(12) == [(10, 0), (11, 0)]
    assert len(o) == 2 and o.below(12) == []
    o.answered(12, 0)
    assert len(o) == 1


def test_early_results_are_bounded() -> None:
    o = Outstanding(limit=2)
    o.result(10, 0, "a")
    o.result(11, 0, "b")
    with pytest.raises(LimitExceeded):
        o.result(12, 0, "c")


def test_the_client_setting_reaches_the_link(secret_file: Path, single_rank_group: None) -> None:
    """``ClientConfig.reconnect_s`` is how a user sets it: 0 turns reconnecting off, else it is the give-up
    time of the policy the link gets."""
    with pytest.raises(ConfigError, match="reconnect_s"):
        ClientConfig(reconnect_s=-1.0)
    assert not ReconnectPolicy.lasting(0.0).enabled
    specs: list[LinkSpec] = []

    def factory(spec: LinkSpec) -> ScriptedLink:
        specs.append(spec)
        return ScriptedLink(spec)

    for seconds in (0.0, 7.5):
        specs.clear()

        ctx = wanrt.client.init(
            "mem://gw",
            site="a",
            job="j",
            secret_file=secret_file,
            config=ClientConfig.dense_baseline(reconnect_s=seconds),
            link_factory=factory,
        )
        SparseOptimizer(torch.nn.Linear(4, 2).named_parameters(), "sgd", lr=0.1, ctx=ctx)
        policy = specs[0].reconnect
        assert policy.enabled == (seconds > 0)
        assert not policy.enabled or policy.give_up_s == seconds
        ctx.close()
