"""The typed job settings keep the wire's bytes: frames the dict-based code sent before the schema
existed (captured from main cfbacbe: an adaptive StellaTrain decision and the ConfigUpdate one gateway made
of it, a parent–child plan, a latency tree's costs, a KILL_RESTART and a local-steps split) decode to the
typed settings, and encoding those settings again gives the same bytes (the same map where the old code's
key order depended on the path a decision took)."""

from __future__ import annotations

from typing import Any

import pytest

from wanrt.protocol import PROTOCOL_VERSION, ConfigUpdate, Message
from wanrt.protocol.frame import decode_frame_body, encode_frame, parse_fixed_header
from wanrt.protocol.job_settings import JobSettings, PlanSettings, TrainerSettings
from wanrt.protocol.limits import FIXED_HEADER_BYTES
from wanrt.protocol.messages import decode_message
from wanrt.protocol.scheduler.messages import SCHEDULER_REGISTRY, Announce

#: hex of whole frames, encoded by the pre-schema code path (see the module docstring)
GOLDEN: dict[str, str] = {
    "adaptive_announce": (
        "574e525401400000020000000000009e00000000c8f99cdf84a86465636973696f6e07a57068617365a7707265706172"
        "65b36566666563746976655f697465726174696f6e28a676616c75657386a764656e73697479cb3fd0000000000000a9"
        "7374616c656e65737300ac62617463685f73697a6540612aac62617463685f73697a65406255ae62617463685f776569"
        "6768744061cb3fe52a54a952a54bae62617463685f7765696768744062cb3ff56ad5ab56ad5b0000"
    ),
    "adaptive_config_update_a": (
        "574e525401210000040000000000005c0000000069d92aa282a676616c75657384a764656e73697479cb3fd000000000"
        "0000a97374616c656e65737300aa62617463685f73697a652aac62617463685f776569676874cb3fe52a54a952a54bb3"
        "6566666563746976655f697465726174696f6e2800000000"
    ),
    "plan_announce": (
        "574e52540140000001000000000000670000000050eb1c0f84a86465636973696f6e08a57068617365a6636f6d6d6974"
        "b36566666563746976655f697465726174696f6e32a676616c75657383a8746f706f6c6f6779ac706172656e745f6368"
        "696c64aa7374726167676c657273a163a5745f775f73cb3fd000000000000000"
    ),
    "costs_announce": (
        "574e52540140000000000000000000580000000099e386fa84a86465636973696f6e09a57068617365a6636f6d6d6974"
        "b36566666563746976655f697465726174696f6e3ca676616c75657381aa736974655f636f737473b7613a302e31322c"
        "623a312e3233652b30332c633a313030"
    ),
    "restart_announce": (
        "574e5254014000000700000000000051000000003bd23eff84a86465636973696f6e0aa57068617365a6636f6d6d6974"
        "b36566666563746976655f697465726174696f6e46a676616c75657382a764656e73697479cb3fa999999999999aa972"
        "65737461727440620100000000000000"
    ),
    "restart_config_update_b": (
        "574e52540121000000000000000000380000000014b694e082a676616c75657382a764656e73697479cb3fa999999999"
        "999aa77265737461727401b36566666563746976655f697465726174696f6e46"
    ),
    "steps_announce": (
        "574e52540140000007000000000000b100000000ec238b0284a86465636973696f6e0ba57068617365a6636f6d6d6974"
        "b36566666563746976655f697465726174696f6e50a676616c75657387a86c725f7363616c65cb4000000000000000ac"
        "62617463685f73697a65406110ae62617463685f7765696768744061cb3fe0000000000000ad6c6f63616c5f73746570"
        "73406104ac62617463685f73697a65406230ae62617463685f7765696768744062cb3ff8000000000000ad6c6f63616c"
        "5f737465707340620100000000000000"
    ),
}

ADAPTIVE = JobSettings(
    density=0.25,
    staleness=0,
    site_batch_size={"a": 42, "b": 85},
    site_batch_weight={"a": 0.6614173228346457, "b": 1.3385826771653544},
)
PLAN = JobSettings(plan=PlanSettings(topology="parent_child", stragglers=("c",), t_w_s=0.25))
COSTS = JobSettings(plan=PlanSettings(site_costs={"a": 0.12, "b": 1230.0, "c": 100.0}))
RESTART = JobSettings(density=0.05, site_restart={"b": 1})
STEPS = JobSettings(
    lr_scale=2.0,
    site_batch_size={"a": 16, "b": 48},
    site_batch_weight={"a": 0.5, "b": 1.5},
    site_local_steps={"a": 4, "b": 1},
)


def _frame(msg: Message) -> str:
    header, buffers = msg.to_wire()
    return b"".join(encode_frame(PROTOCOL_VERSION, msg.TYPE, header, buffers)).hex()


def _decode(name: str) -> Message:
    data = bytes.fromhex(GOLDEN[name])
    fixed = parse_fixed_header(data[:FIXED_HEADER_BYTES])
    raw = decode_frame_body(fixed, data[:FIXED_HEADER_BYTES], bytearray(data[FIXED_HEADER_BYTES:]))
    cls = SCHEDULER_REGISTRY.get(raw.msg_type)
    assert cls is not None
    return decode_message(cls, raw.header, raw.buffers)


@pytest.mark.parametrize(
    ("name", "decision", "phase", "effective", "settings", "same_bytes"),
    [
        ("adaptive_announce", 7, "prepare", 40, ADAPTIVE, True),
        ("plan_announce", 8, "commit", 50, PLAN, True),
        ("costs_announce", 9, "commit", 60, COSTS, True),
        ("restart_announce", 10, "commit", 70, RESTART, True),
        ("steps_announce", 11, "commit", 80, STEPS, False),  # the old split interleaved sites' keys
    ],
)
def test_an_old_announce_decodes_to_the_typed_settings_and_back(
    name: str, decision: int, phase: str, effective: int, settings: JobSettings, same_bytes: bool
) -> None:
    old = _decode(name)
    assert isinstance(old, Announce)
    assert JobSettings.from_wire(old.values) == settings
    new = Announce(decision, phase, effective, settings.to_wire())
    assert new.values == old.values
    if same_bytes:
        assert _frame(new) == GOLDEN[name]
    else:
        assert _frame(new) != GOLDEN[name] and list(new.values) != list(old.values)


@pytest.mark.parametrize(
    ("name", "settings", "site", "effective"),
    [("adaptive_config_update_a", ADAPTIVE, "a", 40), ("restart_config_update_b", RESTART, "b", 70)],
)
def test_a_sites_config_update_keeps_its_bytes(
    name: str, settings: JobSettings, site: str, effective: int
) -> None:
    old = _decode(name)
    assert isinstance(old, ConfigUpdate)
    own = settings.for_site(site)
    assert TrainerSettings.from_wire(old.values) == own
    assert _frame(ConfigUpdate(own.to_wire(), effective)) == GOLDEN[name]


def test_the_flat_form_round_trips_every_setting() -> None:
    every: dict[str, Any] = {
        "density": 0.5,
        "staleness": 1,
        "batch_size": 32,
        "batch_weight": 1.0,
        "local_steps": 2,
        "lr_scale": 1.5,
        "batch_size@a": 16,
        "batch_weight@b": 0.5,
        "local_steps@a": 3,
        "restart@b": 1,
        "topology": "tree",
        "stragglers": "",
        "t_w_s": 0.1,
        "x_order": 2,
        "site_costs": "a:0.123456,b:5",
    }
    settings = JobSettings.from_wire(every)
    assert settings.to_wire() == every
    assert settings.plan.stragglers == () and settings.plan.site_costs == {"a": 0.123456, "b": 5.0}
