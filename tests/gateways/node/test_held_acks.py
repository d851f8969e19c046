"""HeldAcks: a push ack of a result made here waits until a peer has the result (the chaos soak lost a
killed root's last pushes when acks went out before any peer held the result)."""

from __future__ import annotations

from gateways.node.held_acks import HeldAcks


def test_an_ack_waits_for_a_peer_to_acknowledge_the_result_s_frame() -> None:
    held = HeldAcks()
    held.hold((5, 0), ((5, 0),))
    held.hold((5, 0), ((4, 0),))  # a carried push counted by the same result
    held.sent("b", 10, (5, 0))
    held.sent("c", 7, (5, 0))
    assert held and held.unsent() == []  # it went to peers: nothing released yet
    assert held.release("b", 9) == []  # b has not got frame 10 yet
    assert held.release("b", 10) == [((5, 0), (4, 0))]  # one peer holding it is enough
    assert not held and held.release("c", 7) == []  # released once only


def test_a_link_that_ends_releases_only_what_no_other_peer_still_carries() -> None:
    held = HeldAcks()
    held.hold((1, 2), ((1, 2),))
    held.sent("b", 3, (1, 2))
    held.sent("c", 4, (1, 2))
    assert held.release("b", None) == []  # c may still get it
    assert held.release("c", None) == [((1, 2),)]  # nobody left to wait for: the trainer re-sends if lost


def test_a_result_sent_to_nobody_releases_at_once() -> None:
    held = HeldAcks()
    held.hold((2, 0), ((2, 0),))
    held.hold((3, 0), ((3, 0),))
    held.sent("b", 1, (3, 0))
    assert held.unsent() == [((2, 0),)] and held.holds((3, 0)) and not held.holds((2, 0))
