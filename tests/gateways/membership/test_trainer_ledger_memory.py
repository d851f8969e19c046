"""The trainer ledger's per-layer records stay a few ints however long the job runs (chaos soak RSS)."""

from __future__ import annotations

import numpy as np

from gateways.membership.trainer_ledger import TrainerLedger
from wanrt.payload import SparsePayload


def _payload() -> SparsePayload:
    return SparsePayload.from_dense_blocks(0, np.ones(64, np.float32), np.arange(2), 16)


def test_counted_and_answered_iterations_of_a_long_run_are_one_range_each() -> None:
    ledger = TrainerLedger("a", 0)
    for it in range(20_000):
        verdict = ledger.on_push(it, 0, _payload())
        assert verdict.push is not None
        assert ledger.on_deliver(0, (("a", it), ("b", it))) == ((it, 0),)
        assert ledger.answer(it, 0)
    st = ledger._layers[0]
    assert len(st.counted) == 1 and len(st.answered) == 1  # was a set of up to 8 192 ints each
    assert not ledger.answer(19_999, 0) and not ledger.answer(3, 0)  # answered once, old ones too
    assert ledger.on_push(5, 0, _payload()).acks == ((5, 0),)  # a resent old push is acknowledged again


def test_gaps_are_kept_exactly() -> None:
    ledger = TrainerLedger("a", 0)
    for it in (*range(0, 10), *range(20, 30)):
        ledger.on_push(it, 0, _payload())
        ledger.on_deliver(0, (("a", it),))
    st = ledger._layers[0]
    assert len(st.counted) == 2
    assert 9 in st.counted and 10 not in st.counted and 19 not in st.counted and 20 in st.counted
