"""An empty push (zero blocks) is a site's push like any other: the round counts it and completes, and it
adds nothing to the result (a site whose parameters are being resynced pushes empty: docs/kill_restart.md).
Node level: real :class:`GatewayNode` s and handshakes, no sockets or loop."""

from __future__ import annotations

import numpy as np
import pytest

from gateways.config import GatewayConfig
from gateways.node import GatewayNode
from gateways.rounds.config import RoundConfig
from tests.gateways.node.node_mesh import SECRET, NodeMesh
from wanrt.codec.value_casts import in_wire_dtype
from wanrt.payload import SparsePayload
from wanrt.protocol import Aggregate, Push

SITES = "abc"
DENSE = 64  # four blocks of 16


def _node(site: str, rounds: RoundConfig) -> GatewayNode:
    peers = {p: f"tcp://127.0.0.1:{9000 + ord(p)}" for p in SITES if p != site}
    node = GatewayNode(GatewayConfig(site=site, job="j", secret=SECRET, peers=peers, rounds=rounds), 0.0)
    node.start(0.0)
    return node


def _values(site: str, iteration: int) -> np.ndarray:
    return np.random.default_rng(ord(site) * 100 + iteration).standard_normal(DENSE).astype(np.float32)


@pytest.mark.parametrize("topology", ["tree", "star", "ring", "allpairs"])
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_an_empty_push_completes_the_round_and_adds_nothing(topology: str, dtype: str) -> None:
    mesh = NodeMesh({s: _node(s, RoundConfig(topology=topology)) for s in SITES})  # type: ignore[arg-type]
    for a, b in (("a", "b"), ("a", "c"), ("b", "c")):
        mesh.link(a, b)
    for s in SITES:
        mesh.nodes[s].trainer_connected(1)
    blocks = {"a": np.arange(2), "c": np.array([1, 3])}
    for it in range(3):
        for s in SITES:
            if s == "b":  # b's snapshot is pending: it pushes every layer empty
                payload = in_wire_dtype(SparsePayload.empty(0, DENSE, 16), dtype)  # as the link sends it
            else:
                dense = _values(s, it)
                payload = in_wire_dtype(SparsePayload.from_dense_blocks(0, dense, blocks[s], 16), dtype)
            mesh.nodes[s].trainer_push(1, Push("j", it, 0, 0, s, payload), mesh.now)
            mesh.pump()
    for s in SITES:
        got = {m.iteration: m for m in mesh.to_trainer[s] if isinstance(m, Aggregate)}
        assert sorted(got) == [0, 1, 2], (s, sorted(got))  # every round finished, none waits for b
        for it, m in got.items():
            want = np.zeros(DENSE, np.float32)
            for site in "ac":
                p = in_wire_dtype(
                    SparsePayload.from_dense_blocks(0, _values(site, it), blocks[site], 16), dtype
                )
                want += p.to_dense()
            np.testing.assert_allclose(m.payload.to_dense(), want, rtol=1e-3 if dtype == "fp16" else 1e-6)
            assert np.flatnonzero(m.payload.to_dense()[32:48]).size == 0  # block 2: nobody sent it
            # the round protocol sees b's push (the gateway cannot tell an empty push from a push
            # whose blocks all cancelled): it is named among the result's sites
            assert sorted(m.sites) == ["a", "b", "c"], (s, it, m.sites)
        engine = mesh.nodes[s].engine
        assert engine is not None and not engine.open_rounds()
