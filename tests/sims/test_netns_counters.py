"""Reading the kernel's byte counter of a shaped direction (pure parsing; the live read runs in
tests/wanrt/demo/test_ddp_arm.py)."""

from __future__ import annotations

import pytest

from sims.netns.counters import parse_sent_bytes
from sims.netns.run import NetnsError

STATS = """qdisc tbf 1: root refcnt 2 rate 100Mbit burst 32Kb lat 50ms
 Sent 123456 bytes 789 pkt (dropped 0, overlimits 12 requeues 0)
 backlog 0b 0p requeues 0
"""


def test_root_qdisc_bytes() -> None:
    assert parse_sent_bytes(STATS) == 123456
    child = STATS + "qdisc netem 10: parent 1:1\n Sent 99 bytes 1 pkt (dropped 0)\n"
    assert parse_sent_bytes(child) == 123456  # the first (root) qdisc's line


def test_no_counter_is_an_error() -> None:
    with pytest.raises(NetnsError):
        parse_sent_bytes("qdisc noqueue 0: root refcnt 2\n")
