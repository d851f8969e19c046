"""The gateway's Welcome offers the low-bit value codings it decodes, and a trainer's low-bit push is summed
as the trainer sent it."""

from __future__ import annotations

import numpy as np

from gateways.config import GatewayConfig
from gateways.node import GatewayNode, ToTrainer
from gateways.rounds.config import RoundConfig
from wanrt.codec import decode_payload, encode_payload
from wanrt.codec.lowbit import VALUE_CODINGS, quantise_payload
from wanrt.codec.negotiation import check_value_coding
from wanrt.payload import SparsePayload
from wanrt.protocol import Aggregate, Push


def _node() -> GatewayNode:
    cfg = GatewayConfig(site="a", job="j", secret="x" * 32, rounds=RoundConfig(topology="star"))
    node = GatewayNode(cfg, 0.0)
    node.start(0.0)
    node.trainer_model_problem({"run": "r1"})
    node.trainer_connected(1)
    node.pop_actions()
    return node


def test_welcome_offers_every_coding() -> None:
    info = _node().trainer_welcome_info({"run": "r1"})
    for coding in VALUE_CODINGS:
        check_value_coding(coding, info)  # raises UnsupportedValueCoding if not offered


def test_a_low_bit_push_is_delivered_as_sent() -> None:
    node = _node()
    dense = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    q = quantise_payload(SparsePayload.from_dense_blocks(0, dense, np.array([0, 2], np.int64), 16), "int4")
    meta, buffers = encode_payload(q)
    received = decode_payload(meta, [bytes(b) for b in buffers])  # as the trainer's connection decodes it
    node.trainer_push(1, Push("j", 0, 0, 0, "a", received), 1.0)
    out = [a for a in node.pop_actions() if isinstance(a, ToTrainer) and isinstance(a.msg, Aggregate)]
    assert out, "no result for the trainer"
    np.testing.assert_array_equal(out[0].msg.payload.to_dense(), q.to_dense())
