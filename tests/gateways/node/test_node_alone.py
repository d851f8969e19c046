"""The sans-IO gateway node driven directly, without sockets or a loop: a one-site job."""

from __future__ import annotations

import numpy as np
import pytest

from gateways.config import GatewayConfig
from gateways.node import GatewayNode, ToTrainer
from wanrt.errors import MalformedPayload
from wanrt.payload import SparsePayload
from wanrt.protocol import Aggregate, Push


def _node(**kw: object) -> GatewayNode:
    cfg = GatewayConfig(site="a", job="j", secret="x" * 32, **kw)  # type: ignore[arg-type]
    node = GatewayNode(cfg, 0.0)
    node.start(0.0)
    node.trainer_connected(1)
    node.pop_actions()
    return node


def _payload(value: float) -> SparsePayload:
    dense = np.full(64, value, dtype=np.float32)
    return SparsePayload.from_dense_blocks(0, dense, np.arange(4), 16)


def test_a_lone_site_answers_its_own_push_at_once() -> None:
    node = _node()
    assert node.joined and node.next_deadline() is None
    node.trainer_push(1, Push("j", 0, 0, 0, "a", _payload(1.0)), 0.1)
    aggs = [a.msg for a in node.pop_actions() if isinstance(a, ToTrainer) and isinstance(a.msg, Aggregate)]
    assert len(aggs) == 1 and aggs[0].sites == ("a",)
    np.testing.assert_array_equal(aggs[0].payload.to_dense(), np.ones(64, dtype=np.float32))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_are_refused_or_dropped_as_configured(bad: float) -> None:
    p = _payload(1.0)
    p.values[5] = bad
    with pytest.raises(MalformedPayload, match="NaN or Inf"):
        _node().trainer_push(1, Push("j", 0, 0, 0, "a", p), 0.1)
    node = _node(non_finite="drop_payload")
    node.trainer_push(1, Push("j", 0, 0, 0, "a", p), 0.1)
    assert node.stats.non_finite_dropped == 1
    aggs = [a.msg for a in node.pop_actions() if isinstance(a, ToTrainer) and isinstance(a.msg, Aggregate)]
    assert len(aggs) == 1 and aggs[0].payload.nnz == 0  # counted as empty: nothing poisoned


def test_bf16_non_finite_is_seen() -> None:
    p = _payload(1.0)
    bf = SparsePayload(
        p.layer, p.dense_len, p.block_size, p.indices, np.full(p.nnz, 0x7F80, np.uint16), "bf16"
    )
    assert not bf.is_finite() and _payload(2.0).is_finite()
