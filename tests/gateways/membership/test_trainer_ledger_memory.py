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


def test_a_resent_push_older_than_the_first_outcome_waits_for_one_that_reaches_back() -> None:
    """After a restart the first outcome may come from a peer restarted after the push (its record starts
    at its own restart); a peer running since before it knows it was counted. Settled on the first outcome,
    the push was carried and counted twice (chaos soak, full seed 2)."""
    ledger = TrainerLedger("e", 100)  # restarted: joined at 100
    assert ledger.on_push(40, 0, _payload()).acks == ()  # resent, from before the restart
    assert ledger.on_outcome(0, 60, 100, ()) == ()  # a peer whose record starts at 60: cannot say
    assert ledger.undecided()
    assert ledger.on_outcome(0, 0, 100, (("e", 40),)) == ((40, 0),)  # one running since 0: counted
    assert not ledger.undecided() and ledger.stats.unresolved == 0
    assert ledger.on_push(100, 0, _payload()).push is not None and not ledger._layers[0].carry


def test_a_resent_push_no_outcome_reaches_back_to_is_carried_after_the_wait() -> None:
    ledger = TrainerLedger("e", 100)
    ledger.on_push(40, 0, _payload())
    ledger.on_outcome(0, 60, 100, ())
    assert ledger.give_up() == ()
    assert not ledger.undecided() and ledger.stats.unresolved == 1  # carried: at least once
    assert [it for it, _ in ledger.held(0)] == [40]
    ledger.on_push(41, 0, _payload())  # resent after the wait: settled at once
    assert not ledger.undecided()


def test_outcomes_of_many_relinks_stay_a_few_ranges() -> None:
    """Every relink brings each peer's outcome (the newest counted iterations below its join); the union
    was a set that gained an int per listed iteration for the generation's whole life."""
    ledger = TrainerLedger("e", 100)
    for relink in range(2_000):
        join = 100 + 10 * relink
        ids = tuple(("e", it) for it in range(join - 40, join))  # overlapping windows, as peers send
        assert ledger.on_outcome(0, join - 40, join, ids) == ()
    st = ledger._layers[0]
    assert len(st.outcome_counted) == 1  # one run of counted iterations, however many outcomes
    assert 100 + 10 * 1_999 - 1 in st.outcome_counted and 59 not in st.outcome_counted
    # still what settles a push resent from before the restart
    assert ledger.on_push(70, 0, _payload()).acks == ((70, 0),)


def test_an_outcome_with_gaps_keeps_them() -> None:
    ledger = TrainerLedger("e", 100)
    ledger.on_outcome(0, 0, 100, (("e", 40), ("e", 41), ("e", 60), ("f", 50)))
    st = ledger._layers[0]
    assert len(st.outcome_counted) == 2
    assert 41 in st.outcome_counted and 42 not in st.outcome_counted and 50 not in st.outcome_counted
    assert ledger.on_push(42, 0, _payload()).acks == ()  # not counted: carried, not acknowledged
    assert ledger._layers[0].carry and ledger._layers[0].carry[0][0] == 42
