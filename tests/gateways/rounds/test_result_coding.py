"""Results re-coded in the trainers' low-bit values (``result_coding = "wire"``, issue 23 item 1): the sum
leaves the gateway that made it as 2-bit codes, every site gets bit-identical values, and the coding's
error is held in that gateway's residual, so results plus what the gateways hold equal what was pushed."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gateways.rounds.actions import Send
from gateways.rounds.config import RoundConfig
from gateways.rounds.forward_bound import ForwardBound
from gateways.rounds.layer_formats import LayerFormats
from gateways.rounds.result_coding import requantise
from gateways.rounds.topology import PlanSpec
from tests.gateways.harness import Net, Trainers, distinct_finals
from tools.harness.exact_payloads import layer_shape, make_payload
from wanrt.codec import decode_payload, encode_payload
from wanrt.codec.lowbit import quantise_payload, usable_coded
from wanrt.errors import ConfigError
from wanrt.payload import SparsePayload

WIRE = RoundConfig(forward_policy="cap", forward_density=0.6, result_coding="wire")


def _coded(site: str, it: int, layer: int, coding: str = "int2") -> SparsePayload:
    """A trainer's push as the leader sends it: quantised, codes attached (docs/codec.md)."""
    return quantise_payload(make_payload(site, it, layer), coding)


def _payload(rng: np.random.Generator, nb: int, k: int, bs: int = 16, layer: int = 0) -> SparsePayload:
    idx = np.sort(rng.choice(nb, size=k, replace=False)).astype(np.int64)
    dense = rng.standard_normal(nb * bs).astype(np.float32)
    return SparsePayload.from_dense_blocks(layer, dense, idx, bs)


# ------------------------------------------------------------------------------------------------------
# the re-coding itself
# ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("coding", ["int8", "int4", "int2"])
def test_requantise_keeps_the_error_in_the_residual(coding: str) -> None:
    rng = np.random.default_rng(1)
    kept, rest = _payload(rng, 64, 20), _payload(rng, 64, 5)
    rest = SparsePayload(0, rest.dense_len, 16, np.setdiff1d(rest.indices, kept.indices), np.zeros(0))
    rest = SparsePayload.from_dense_blocks(0, np.ones(64 * 16, np.float32), rest.indices, 16)
    q, left = requantise(kept, rest, (coding, 16))
    lv = usable_coded(q)
    assert lv is not None and lv.coding == coding and lv.scale_block == 16  # the codec sends these codes
    assert np.array_equal(q.indices, kept.indices)
    assert left is not None
    total = q.to_dense() + left.to_dense()
    np.testing.assert_allclose(total, kept.to_dense() + rest.to_dense(), rtol=0, atol=1e-6)
    assert not np.array_equal(q.values, kept.values)  # it did round: the residual holds a real error
    # what a receiver decodes is bit for bit what the maker delivers to its own trainers
    meta, bufs = encode_payload(q)
    assert meta["dtype"] == coding
    got = decode_payload(meta, [bytes(b) for b in bufs], peer="x")
    assert got.values.tobytes() == q.values.tobytes()


def test_requantise_leaves_coded_empty_and_uncodable_payloads_alone() -> None:
    p = _coded("a", 0, 0)
    assert requantise(p, None, ("int2", 16)) == (p, None)  # a lone push relayed whole: its own codes
    empty = SparsePayload.empty(0, 64, 16)
    assert requantise(empty, None, ("int2", 16)) == (empty, None)
    bad = SparsePayload.from_dense_blocks(0, np.full(64, np.inf, np.float32), np.array([0]), 16)
    q, left = requantise(bad, None, ("int2", 16))
    assert q is bad and left is None  # not codable: sent as fp32 (the codec's fall-back), nothing held


def test_forward_bound_recodes_only_capped_low_bit_results() -> None:
    formats = LayerFormats(wire_sums=True)
    rng = np.random.default_rng(2)
    p = _payload(rng, 100, 80)
    bound = ForwardBound(WIRE, formats.coding)
    kept, rest = bound.bound(p, None)
    assert usable_coded(kept) is None and rest is not None  # coding unknown yet: capped, not re-coded
    formats.pushed(0, _coded("a", 0, 0, "int4"))
    kept, rest = bound.bound(p, None)
    lv = usable_coded(kept)
    assert lv is not None and lv.coding == "int4" and kept.nnz_blocks == 60
    assert rest is not None
    np.testing.assert_allclose(kept.to_dense() + rest.to_dense(), p.to_dense(), rtol=0, atol=1e-6)
    exact = ForwardBound(RoundConfig(forward_policy="cap", forward_density=0.6), formats.coding)
    assert usable_coded(exact.bound(p, None)[0]) is None  # result_coding "exact": fp32 as before


def test_layer_coding_is_the_trainers_and_survives_an_fp32_fallback() -> None:
    f = LayerFormats(wire_sums=True)
    f.check(0, _coded("b", 0, 0, "int8"), "b")
    assert f.coding(0) == ("int8", 16)  # a peer's, while the own trainers have not pushed
    f.pushed(0, _coded("a", 0, 0, "int2"))
    assert f.coding(0) == ("int2", 16)  # the own trainers' wins
    f.check(0, _coded("b", 1, 0, "int8"), "b")
    f.pushed(0, make_payload("a", 1, 0))  # a push that fell back to fp32
    assert f.coding(0) == ("int2", 16)


def test_result_coding_setting_is_checked() -> None:
    with pytest.raises(ConfigError, match="result_coding"):
        RoundConfig(result_coding="wire")  # without the cap a result's support would grow every round
    with pytest.raises(ConfigError, match="result_coding"):
        RoundConfig(forward_policy="cap", result_coding="int2")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------------
# gateways: the engine on virtual time
# ------------------------------------------------------------------------------------------------------
def _held_sum(net: Net, layer: int, dense_len: int) -> Any:
    got = np.zeros(dense_len, np.float64)
    for s in net.sites:
        for p, ids in net.engines[s].held(layer):
            assert not ids  # every push counted: only residuals are held
            if p is not None:
                got += p.to_dense()
    return got


@pytest.mark.parametrize(
    ("sites", "kind"), [("abc", "tree"), ("abcd", "star"), ("abcd", "ring"), ("abcd", "allpairs")]
)
def test_results_travel_low_bit_identically_and_nothing_is_lost(sites: str, kind: str) -> None:
    net = Net(sites, PlanSpec.make(kind), WIRE)  # type: ignore[arg-type]
    wire_bytes: dict[str, int] = {}

    def on_send(site: str, a: Any) -> None:
        if isinstance(a, Send) and a.msg.payload is not None and a.msg.payload.nnz_blocks:
            meta, bufs = encode_payload(a.msg.payload)
            wire_bytes[meta["dtype"]] = wire_bytes.get(meta["dtype"], 0) + sum(len(b) for b in bufs)
            if a.msg.kind in ("final", "segment_final"):
                # what the receiver decodes is bit for bit what the sender holds
                back = decode_payload(meta, [bytes(b) for b in bufs], peer=site)
                assert back.values.tobytes() == np.asarray(a.msg.payload.values_f32()).tobytes()

    net.listeners.append(on_send)
    tr = Trainers(net, iterations=30, layers=3, payload=_coded)
    tr.start()
    net.run()
    assert not net.errors
    finals = distinct_finals(net)  # bit-identical at every site
    assert len(finals) == 30 * 3
    if kind in ("tree", "star"):  # one place makes every result, and re-codes it: all of the WAN is 2-bit
        assert set(wire_bytes) == {"int2"}
        assert all(usable_coded(d.payload) is not None for d in finals.values() if d.payload is not None)
    else:  # a segment owner's residual rides in its own next contribution, in fp32 (docs/codec.md)
        assert wire_bytes.get("int2", 0) > 0
    for layer in range(3):  # Σ results + Σ residuals held == Σ pushes, up to fp32 roundings
        dense_len = layer_shape(layer)[0]
        got = _held_sum(net, layer, dense_len)
        for (_, lay), d in finals.items():
            assert {s for s, _ in d.sites} <= set(sites)
            if lay == layer and d.payload is not None:
                got += d.payload.to_dense()
        want = np.zeros(dense_len, np.float64)
        for _, _, lay, p in net.pushes:
            if lay == layer:
                want += p.to_dense()
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-3)
        assert np.abs(want).max() > 1  # the check is not vacuous


def test_exact_results_of_low_bit_pushes_still_travel_in_fp32() -> None:
    net = Net("abc", PlanSpec.make("tree"), RoundConfig(forward_policy="cap", forward_density=0.6))
    kinds: set[tuple[str, str]] = set()
    net.listeners.append(
        lambda s, a: (
            kinds.add((a.msg.kind, encode_payload(a.msg.payload)[0]["dtype"]))
            if isinstance(a, Send) and a.msg.payload is not None and a.msg.payload.nnz_blocks
            else None
        )
    )
    tr = Trainers(net, iterations=10, layers=2, payload=_coded)
    tr.start()
    net.run()
    assert not net.errors
    assert ("final", "fp32") in kinds  # the A side of the A/B: a sum of two or more travels in fp32
