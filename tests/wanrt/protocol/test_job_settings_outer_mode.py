"""The outer loop's mode in the job settings (issue 23 item 4): ``outer_steps`` (DiLoCo's H), ``fragments``
(Streaming DiLoCo's fragment count) and ``outer_coding`` (the pseudo-gradient's value coding) are job-wide,
bounded, carried by an Announce and a ConfigUpdate with fixed bytes, and refused per site by name."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wanrt.errors import ConfigError
from wanrt.protocol import PROTOCOL_VERSION, ConfigUpdate, Message
from wanrt.protocol.frame import encode_frame
from wanrt.protocol.job_settings import (
    MAX_FRAGMENTS,
    MAX_OUTER_STEPS,
    OUTER_CODINGS,
    JobSettings,
    TrainerSettings,
)
from wanrt.protocol.scheduler.messages import Announce

#: the frames this schema sends for a streaming decision (frozen here: a change of these bytes is a change
#: of the wire every gateway and trainer of a running job must agree on)
GOLDEN_ANNOUNCE = (
    "574e525401400000000000000000007000000000c089ff1584a86465636973696f6e0ca57068617365a6636f6d6d6974b365"
    "66666563746976655f697465726174696f6e60a676616c75657384a764656e73697479cb3f9eb851eb851eb8ab6f75746572"
    "5f737465707340a9667261676d656e747304ac6f757465725f636f64696e67a4696e7432"
)
GOLDEN_UPDATE = (
    "574e52540121000007000000000000590000000076f8c9d982a676616c75657384a764656e73697479cb3f9eb851eb851eb8"
    "ab6f757465725f737465707340a9667261676d656e747304ac6f757465725f636f64696e67a4696e7432b365666665637469"
    "76655f697465726174696f6e6000000000000000"
)
STREAMING = JobSettings(density=0.03, outer_steps=64, fragments=4, outer_coding="int2")


def _frame(msg: Message) -> str:
    header, buffers = msg.to_wire()
    return b"".join(encode_frame(PROTOCOL_VERSION, msg.TYPE, header, buffers)).hex()


def test_a_streaming_decision_has_its_golden_bytes() -> None:
    assert _frame(Announce(12, "commit", 96, STREAMING.to_wire())) == GOLDEN_ANNOUNCE
    own = STREAMING.for_site("a")
    assert own == TrainerSettings(density=0.03, outer_steps=64, fragments=4, outer_coding="int2")
    assert _frame(ConfigUpdate(own.to_wire(), 96)) == GOLDEN_UPDATE


def test_every_site_gets_the_same_mode() -> None:
    s = JobSettings(outer_steps=16, fragments=1, outer_coding="int8", site_local_steps={"a": 2, "b": 1})
    for site in ("a", "b"):
        mine = s.for_site(site)
        assert (mine.outer_steps, mine.fragments, mine.outer_coding) == (16, 1, "int8")


@given(
    h=st.integers(1, MAX_OUTER_STEPS),
    f=st.integers(1, MAX_FRAGMENTS),
    coding=st.sampled_from(OUTER_CODINGS),
)
def test_the_flat_form_round_trips(h: int, f: int, coding: str) -> None:
    values: dict[str, Any] = {"outer_steps": h, "fragments": f, "outer_coding": coding}
    if f > h:
        for read in (JobSettings.from_wire, TrainerSettings.from_wire):
            with pytest.raises(ConfigError) as err:
                read(values)
            assert err.value.fields["key"] == "fragments"
        return
    s = JobSettings.from_wire(values)
    assert s.to_wire() == values
    assert TrainerSettings.from_wire(s.for_site("x").to_wire()) == s.for_site("x")


@pytest.mark.parametrize(
    ("key", "bad"),
    [
        ("outer_steps", 0),
        ("outer_steps", MAX_OUTER_STEPS + 1),
        ("outer_steps", 2.0),
        ("outer_steps", True),
        ("fragments", 0),
        ("fragments", MAX_FRAGMENTS + 1),
        ("outer_coding", "bf16"),
        ("outer_coding", 8),
        ("outer_steps@a", 8),
        ("fragments@b", 2),
        ("outer_coding@a", "int8"),
    ],
)
def test_a_bad_or_per_site_value_is_refused_by_name(key: str, bad: object) -> None:
    for read in (TrainerSettings.from_wire, JobSettings.from_wire):
        with pytest.raises(ConfigError) as err:
            read({key: bad})
        assert err.value.fields["key"] == key


def test_a_change_of_h_alone_keeps_the_running_fragments_in_bounds() -> None:
    running = JobSettings(outer_steps=64, fragments=8)
    assert running.overlay(JobSettings(outer_steps=32)).fragments == 8
    with pytest.raises(ConfigError):
        running.overlay(JobSettings(outer_steps=4))
