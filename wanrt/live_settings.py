"""The settings a running job may change (density, staleness bound, batch size, the site's share of the
job's samples, its local micro-steps per WAN iteration and the job's learning-rate scale; and the gateways'
WAN plan: topology, straggler sites, t_w), and their bounds: one schema shared by the trainer client, the
gateway and the scheduler, so a value one of them accepts is never refused (or worse, crashes a trainer) at
another.

The plan keys (:data:`PLAN_KEYS`) are for the gateways, not the trainers: a gateway applies them to its
round engine at the decision's effective iteration (STAR §IV-B parent–child: ``topology = "parent_child"``,
``stragglers = "c"`` detaches site c and attaches it to a ring member that waits ``t_w_s`` for it; static
x-order: ``x_order = x`` lets a root go on once x sites contributed, 0 = wait for all) and
forwards only :data:`TRAINER_KEYS` to its trainers. What the schema cannot know (whether a named site is in
the job) the gateway checks in the prepare phase.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

from wanrt.config import check
from wanrt.errors import ConfigError
from wanrt.protocol.limits import MAX_RANK, MAX_SITES, MAX_STR_CHARS

__all__ = [
    "JOB_WIDE_KEYS",
    "LIVE_KEYS",
    "MAX_BATCH_SIZE",
    "MAX_LOCAL_STEPS",
    "MAX_LR_SCALE",
    "MAX_SITE_COSTS_CHARS",
    "MAX_STALENESS",
    "MAX_T_W_S",
    "PLAN_KEYS",
    "PLAN_TOPOLOGIES",
    "RESTART_FROM_KEY",
    "RESTART_KEY",
    "TRAINER_KEYS",
    "check_live_settings",
    "format_site_costs",
    "parse_site_costs",
    "parse_stragglers",
    "split_plan_values",
]

#: A one-shot order, not a setting: the site rank the scheduler's KILL_RESTART names (AntDT §V-E3). Only the
#: scheduler's two phases may carry it (``restart@<site>`` in a decision); the gateway forwards it once to
#: the trainer session connected at the commit and never replays or reports it, and ``POST /config`` (of the
#: scheduler or a gateway) refuses it.
RESTART_KEY: Final = "restart"
#: The gateway's Welcome info key for the trainer process that replaces a restarted one: the iteration it
#: starts at (gateways.node.trainer_restart sets it, wanrt.client.link.gateway_link reads it).
RESTART_FROM_KEY: Final = "restart_from"
#: Keys a ConfigUpdate may carry for the trainers.
TRAINER_KEYS: Final = (
    "density",
    "staleness",
    "batch_size",
    "batch_weight",
    "local_steps",
    "lr_scale",
    RESTART_KEY,
)
#: Keys that hold one value for the whole job and have no ``<key>@<site>`` form. ``lr_scale``: every site
#: applies the same aggregated update, so a learning rate that differed between sites would make their
#: parameter copies diverge after the first step.
JOB_WIDE_KEYS: Final = ("lr_scale",)
#: Keys the gateways apply to their WAN plan (never forwarded to trainers).
PLAN_KEYS: Final = ("topology", "stragglers", "t_w_s", "x_order", "site_costs")
#: Every key a decision may carry.
LIVE_KEYS: Final = TRAINER_KEYS + PLAN_KEYS
#: The gateways' plan kinds (gateways.rounds.topology.TOPOLOGY_KINDS; a test keeps the two equal, the
#: public package does not import the gateway's).
PLAN_TOPOLOGIES: Final = ("star", "tree", "ring", "parent_child", "allpairs")
#: RoundConfig.t_w_s's bound: STAR Fig. 29 waits 30–300 ms; an hour means a typo or a dead child.
MAX_T_W_S: Final = 3600.0

#: ``site_costs`` travels as one string in an Announce, whose strings the wire bounds (MAX_STR_CHARS).
MAX_SITE_COSTS_CHARS: Final = MAX_STR_CHARS
#: A site cost is seconds per round payload; a day means a unit error, not a slow link.
MAX_SITE_COST: Final = 86_400.0

#: StellaTrain §3.3 bounds staleness by 1; a little more is allowed for experiments, but an unbounded value
#: would let a slow site's updates pile up in the leader's memory without limit.
MAX_STALENESS: Final = 4

#: Samples per rank and step; far above any GPU's memory, low enough that a typo is caught.
MAX_BATCH_SIZE: Final = 1 << 20

#: Local micro-steps (gradients accumulated, no exchange) per WAN iteration (ElasticBSP §4's iterations
#: between two barriers). ZipLine's lookahead R bounds what a scheduler picks (ElasticBSP uses R ≤ ~100);
#: more than this would leave a site's gradient unsent for minutes, which no WAN needs.
MAX_LOCAL_STEPS: Final = 256

#: The factor on the user's learning rate (STAR §IV-C: r_new = (M_new / M) · r_SSGD, linear scaling as in
#: Goyal et al. 2017). 64 allows a WAN iteration of 64× the samples at full linear scaling, beyond which
#: Goyal et al.'s warm-up-free regime has long broken down; more means a unit error, not a batch.
MAX_LR_SCALE: Final = 64.0


#: The integer settings and their inclusive bounds (x_order: STAR §IV-B static x-order, 0 = wait for all).
_INT_RANGES: Final[dict[str, tuple[int, int]]] = {
    "x_order": (0, MAX_SITES),
    "local_steps": (1, MAX_LOCAL_STEPS),
    "staleness": (0, MAX_STALENESS),
    "batch_size": (1, MAX_BATCH_SIZE),
}


def check_live_settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` as a plain dict if every key is known and every value in bounds; ConfigError names the
    first bad key."""
    if not values:
        raise ConfigError("no settings given", key="values")
    for key, value in values.items():
        base = key.partition("@")[0]
        if base in JOB_WIDE_KEYS and base != key:
            raise ConfigError(
                f"{key}: {base} is one value for the whole job, never per site (every site applies the "
                f"same aggregated update: different learning rates would make the sites' parameters "
                f"diverge); set {base} without @<site>",
                key=key,
                value=value,
            )
        check(key in LIVE_KEYS, key, value, f"settings that can change are {', '.join(LIVE_KEYS)}")
        if key == "density":
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            check(number and 0 < value <= 1, key, value, "a number in (0, 1]")
        elif key == "batch_weight":
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            check(number and 0 < value <= MAX_SITES, key, value, f"a number in (0, {MAX_SITES}]")
        elif key == "lr_scale":
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            ok = number and math.isfinite(value) and 0 < value <= MAX_LR_SCALE
            check(ok, key, value, f"a number in (0, {MAX_LR_SCALE:g}]")
        elif key == "topology":
            check(value in PLAN_TOPOLOGIES, key, value, f"one of {', '.join(PLAN_TOPOLOGIES)}")
        elif key == "stragglers":
            check(isinstance(value, str), key, value, "comma-separated site names (empty: none)")
            parse_stragglers(value)
        elif key == "site_costs":  # STAR §IV-D2: the tree's order (cheapest site = root)
            check(isinstance(value, str), key, value, '"site:cost,..." (seconds; empty: none)')
            parse_site_costs(value)
        elif key == "t_w_s":
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            check(number and 0 <= value <= MAX_T_W_S, key, value, f"seconds in [0, {MAX_T_W_S:g}]")
        elif key == RESTART_KEY:
            check(type(value) is int and 0 <= value < MAX_RANK, key, value, f"a rank in [0, {MAX_RANK})")
        else:  # x_order (STAR §IV-B: the root goes on after x sites), local_steps, staleness, batch_size
            lo, hi = _INT_RANGES[key]
            check(type(value) is int and lo <= value <= hi, key, value, f"an integer in [{lo}, {hi}]")
    return dict(values)


def parse_stragglers(value: str) -> tuple[str, ...]:
    """``"c, d"`` → ``("c", "d")`` (sorted, no duplicates; ``""`` → none); ConfigError for an empty name."""
    names = [n.strip() for n in value.split(",")] if value.strip() else []
    for n in names:
        check(bool(n) and "@" not in n, "stragglers", value, "comma-separated site names (empty: none)")
    check(len(names) <= MAX_SITES, "stragglers", value, f"at most {MAX_SITES} sites")
    return tuple(sorted(set(names)))


def parse_site_costs(value: str) -> dict[str, float]:
    """``"b:0.4, a:0.12"`` → ``{"a": 0.12, "b": 0.4}`` (``""`` → none); ConfigError names ``site_costs``
    for a malformed entry, a repeated site, a cost that is not a finite number in [0, a day], or a string
    longer than one Announce string may be."""
    key = "site_costs"
    check(
        len(value) <= MAX_SITE_COSTS_CHARS, key, value[:40] + "...", f"at most {MAX_SITE_COSTS_CHARS} chars"
    )
    out: dict[str, float] = {}
    for part in value.split(",") if value.strip() else []:
        name, sep, number = part.partition(":")
        name = name.strip()
        check(bool(sep) and bool(name) and "@" not in name, key, part, '"site:cost" entries')
        try:
            cost = float(number)
        except ValueError:
            raise ConfigError(f"site_costs: {part!r} is not site:seconds", key=key, value=part) from None
        check(0.0 <= cost <= MAX_SITE_COST, key, part, f"costs are seconds in [0, {MAX_SITE_COST:g}]")
        check(name not in out, key, part, "one cost per site")
        out[name] = cost
    check(len(out) <= MAX_SITES, key, len(out), f"at most {MAX_SITES} sites")
    return dict(sorted(out.items()))


def format_site_costs(costs: Mapping[str, float], digits: int = 3) -> str:
    """The canonical ``site_costs`` string (sites by name, ``digits`` significant digits): equal costs
    give equal strings, so a decision that changes nothing is recognisably the same."""
    return ",".join(f"{s}:{float(c):.{digits}g}" for s, c in sorted(costs.items()))


def split_plan_values(values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the trainers' settings, the gateway's plan settings) of a decision's values."""
    trainer = {k: v for k, v in values.items() if k not in PLAN_KEYS}
    plan = {k: v for k, v in values.items() if k in PLAN_KEYS}
    return trainer, plan
