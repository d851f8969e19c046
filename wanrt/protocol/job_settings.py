"""The job's live settings as types: what a decision may change, for whom, and within which bounds. One
schema for the trainer client, the gateway and the scheduler, so a value one of them accepts is never
refused (or worse, crashes a trainer) at another. Sans-IO, and on the ground floor: it imports only
wanrt's errors, config checks and protocol limits.

Three frozen records:

- :class:`TrainerSettings`: what one site's trainers apply from an iteration on — density, staleness
  bound, per-rank batch size, the site's share of the job's samples (``batch_weight``), local micro-steps
  per WAN iteration, the job's learning-rate scale, the outer loop's mode (inner steps per outer step,
  fragments, the pseudo-gradient's coding: docs/scheduler.md "The mode choice"), and a one-shot
  KILL_RESTART order. A ``ConfigUpdate``
  carries exactly this.
- :class:`PlanSettings`: the gateways' WAN plan (STAR §IV-B parent–child: ``topology = "parent_child"``,
  ``stragglers = ("c",)`` detaches site c and attaches it to a ring member that waits ``t_w_s`` for it;
  static x-order: ``x_order = x`` lets a root go on once x sites contributed, 0 = wait for all; STAR
  §IV-D2's ``site_costs`` orders a tree). Gateways apply it to their round engine and forward none of it.
- :class:`JobSettings`: one decision's values for the whole job — job-wide trainer settings, per-site
  values as maps keyed by site (``site_batch_size["a"]`` = per-rank batch at site a), and the plan. The
  scheduler's policies produce it, the two phases carry it, and each gateway takes its own site's
  :class:`TrainerSettings` out of it (:meth:`JobSettings.for_site`).

One validator (:func:`check_setting`) bounds every value, whichever record holds it. Every record is
encoded once on the wire: :meth:`TrainerSettings.to_wire` / :meth:`TrainerSettings.from_wire` for a
``ConfigUpdate``'s values, and :meth:`JobSettings.to_wire` / :meth:`JobSettings.from_wire` for an
``Announce``'s values and the JSON of ``POST /config`` and the decisions file. The wire's flat form
(a per-site value keyed ``"<key>@<site>"``, a plan's stragglers and costs as one string each) exists
only in those two functions, which keep the bytes the earlier dict-based code sent (a golden test holds
them to it). What the schema cannot know (whether a named site is in the job) the gateway and the
scheduler check.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Literal, TypeAlias

from wanrt.config import check
from wanrt.errors import ConfigError
from wanrt.protocol.limits import MAX_RANK, MAX_SITES, MAX_STR_CHARS

__all__ = [
    "JOB_WIDE_KEYS",
    "LIVE_KEYS",
    "MAX_BATCH_SIZE",
    "MAX_FRAGMENTS",
    "MAX_LOCAL_STEPS",
    "MAX_LR_SCALE",
    "MAX_OUTER_STEPS",
    "MAX_SITE_COSTS_CHARS",
    "MAX_STALENESS",
    "MAX_T_W_S",
    "OUTER_CODINGS",
    "PER_SITE_KEYS",
    "PLAN_KEYS",
    "PLAN_TOPOLOGIES",
    "RESTART_FROM_KEY",
    "RESTART_KEY",
    "TRAINER_KEYS",
    "JobSettings",
    "PlanSettings",
    "PlanTopology",
    "TrainerSettings",
    "check_setting",
    "format_site_costs",
    "parse_site_costs",
    "parse_stragglers",
    "per_site",
    "site_key",
]

#: A one-shot order, not a setting: the site rank the scheduler's KILL_RESTART names (AntDT §V-E3). Only the
#: scheduler's two phases may carry it (per site, :attr:`JobSettings.site_restart`); the gateway forwards it
#: once to the trainer session connected at the commit and never replays or reports it, and ``POST /config``
#: (of the scheduler or a gateway) refuses it.
RESTART_KEY: Final = "restart"
#: The gateway's Welcome info key for the trainer process that replaces a restarted one: the iteration it
#: starts at (gateways.node.trainer_restart sets it, wanrt.client.link.gateway_link reads it).
RESTART_FROM_KEY: Final = "restart_from"
#: The settings a ConfigUpdate may carry for the trainers (the fields of :class:`TrainerSettings`, in the
#: order they go on the wire).
TRAINER_KEYS: Final = (
    "density",
    "staleness",
    "batch_size",
    "batch_weight",
    "local_steps",
    "lr_scale",
    "outer_steps",
    "fragments",
    "outer_coding",
    RESTART_KEY,
)
#: Settings that hold one value for the whole job and have no per-site form. ``lr_scale``: every site
#: applies the same aggregated update, so a learning rate that differed between sites would make their
#: parameter copies diverge after the first step.
#: ``outer_steps``, ``fragments`` and ``outer_coding`` (the outer loop's mode, docs/scheduler.md "The mode
#: choice"): every site must take its outer step at the same inner step, with the same fragment and the same
#: pseudo-gradient coding, or the averaged pseudo-gradient mixes sites at different points.
JOB_WIDE_KEYS: Final = ("lr_scale", "outer_steps", "fragments", "outer_coding")
#: Settings that may differ per site (:class:`JobSettings`' ``site_<key>`` maps). A restart is per site only.
PER_SITE_KEYS: Final = ("batch_size", "batch_weight", "local_steps", RESTART_KEY)
#: The gateways' WAN plan settings (the fields of :class:`PlanSettings`; never forwarded to trainers).
PLAN_KEYS: Final = ("topology", "stragglers", "t_w_s", "x_order", "site_costs")
#: Every setting a decision may carry.
LIVE_KEYS: Final = TRAINER_KEYS + PLAN_KEYS
#: The gateways' plan kinds (gateways.rounds.topology.TOPOLOGY_KINDS; a test keeps the two equal, the
#: ground floor does not import the gateway's).
PlanTopology: TypeAlias = Literal["star", "tree", "ring", "parent_child", "allpairs"]
PLAN_TOPOLOGIES: Final[tuple[PlanTopology, ...]] = ("star", "tree", "ring", "parent_child", "allpairs")
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

#: Inner steps per outer step (DiLoCo's H, arXiv 2311.08105 §2; 1 = per-step exchange). DiLoCo runs H = 500
#: (its Fig. 5 goes to 2 000); ten times that leaves a site's progress unshared for hours at any step time.
MAX_OUTER_STEPS: Final = 20_000
#: Fragments of a streaming outer loop (Streaming DiLoCo, arXiv 2501.18512 §2.2; 1 = plain DiLoCo). The
#: paper splits a model into its layer groups (P of a few to tens); more fragments than this would make each
#: fragment's exchange a handful of bytes, whose round latency no link amortises.
MAX_FRAGMENTS: Final = 256
#: The pseudo-gradient's value codings (wanrt/codec: fp32/fp16 casts and the low-bit codes with a scale
#: per block; the per-step path keeps the wire dtype the trainer connected with).
OUTER_CODINGS: Final = ("fp32", "fp16", "int8", "int4", "int2")

#: The integer settings and their inclusive bounds (x_order: STAR §IV-B static x-order, 0 = wait for all).
_INT_RANGES: Final[dict[str, tuple[int, int]]] = {
    "x_order": (0, MAX_SITES),
    "local_steps": (1, MAX_LOCAL_STEPS),
    "staleness": (0, MAX_STALENESS),
    "batch_size": (1, MAX_BATCH_SIZE),
    "outer_steps": (1, MAX_OUTER_STEPS),
    "fragments": (1, MAX_FRAGMENTS),
}
#: The wire's separator between a per-site setting and its site (``batch_size@a``).
_AT: Final = "@"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_setting(name: str, value: Any, key: str | None = None) -> None:
    """The one validator: ConfigError (naming ``key``, the setting's wire name, default ``name``) unless
    ``value`` is a valid value of setting ``name``. Plan strings (``stragglers``, ``site_costs``) are
    checked in their wire form; :class:`PlanSettings` checks its typed forms by encoding them."""
    key = key or name
    check(name in LIVE_KEYS, key, value, f"settings that can change are {', '.join(LIVE_KEYS)}")
    if name == "density":
        check(_number(value) and 0 < value <= 1, key, value, "a number in (0, 1]")
    elif name == "batch_weight":
        check(_number(value) and 0 < value <= MAX_SITES, key, value, f"a number in (0, {MAX_SITES}]")
    elif name == "lr_scale":
        ok = _number(value) and math.isfinite(value) and 0 < value <= MAX_LR_SCALE
        check(ok, key, value, f"a number in (0, {MAX_LR_SCALE:g}]")
    elif name == "topology":
        check(value in PLAN_TOPOLOGIES, key, value, f"one of {', '.join(PLAN_TOPOLOGIES)}")
    elif name == "stragglers":
        check(isinstance(value, str), key, value, "comma-separated site names (empty: none)")
        parse_stragglers(value)
    elif name == "site_costs":  # STAR §IV-D2: the tree's order (cheapest site = root)
        check(isinstance(value, str), key, value, '"site:cost,..." (seconds; empty: none)')
        parse_site_costs(value)
    elif name == "t_w_s":
        check(_number(value) and 0 <= value <= MAX_T_W_S, key, value, f"seconds in [0, {MAX_T_W_S:g}]")
    elif name == "outer_coding":
        check(value in OUTER_CODINGS, key, value, f"one of {', '.join(OUTER_CODINGS)}")
    elif name == RESTART_KEY:
        check(type(value) is int and 0 <= value < MAX_RANK, key, value, f"a rank in [0, {MAX_RANK})")
    else:  # x_order (STAR §IV-B), local_steps, staleness, batch_size, outer_steps, fragments
        lo, hi = _INT_RANGES[name]
        check(type(value) is int and lo <= value <= hi, key, value, f"an integer in [{lo}, {hi}]")


def parse_stragglers(value: str) -> tuple[str, ...]:
    """``"c, d"`` → ``("c", "d")`` (sorted, no duplicates; ``""`` → none); ConfigError for an empty name."""
    names = [n.strip() for n in value.split(",")] if value.strip() else []
    for n in names:
        check(bool(n) and _AT not in n, "stragglers", value, "comma-separated site names (empty: none)")
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
        check(bool(sep) and bool(name) and _AT not in name, key, part, '"site:cost" entries')
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


def _cost_text(cost: float) -> str:
    """A cost as the wire writes it: 3 significant digits (what the tree policy rounds to, so its
    decisions keep their bytes) unless that would lose an operator's finer value; then the fewest digits
    that read back as the same float."""
    for digits in (3, *range(4, 18)):
        text = f"{cost:.{digits}g}"
        if float(text) == cost:
            return text
    return repr(cost)


def _frozen_map(value: Mapping[str, Any] | None, name: str) -> Mapping[str, Any]:
    """A per-site map as a read-only mapping sorted by site (records are values: frozen and comparable)."""
    if value is None:
        return MappingProxyType({})
    if not isinstance(value, Mapping):
        raise ConfigError(f"{name} must be a map of site -> value", key=name, value=type(value).__name__)
    for site in value:
        check(isinstance(site, str) and bool(site) and _AT not in site, name, site, "site names")
    check(len(value) <= MAX_SITES, name, len(value), f"at most {MAX_SITES} sites")
    return MappingProxyType(dict(sorted(value.items())))


@dataclass(frozen=True, slots=True)
class TrainerSettings:
    """What one site's trainers apply from a ConfigUpdate's iteration on (``None``: unchanged)."""

    density: float | None = None
    staleness: int | None = None
    #: samples per rank and step
    batch_size: int | None = None
    #: this site's share of the job's samples × the number of sites (1 = an equal share): its gradient is
    #: scaled by it before the sum across sites, so the job's update averages samples, not sites
    batch_weight: float | None = None
    #: local micro-steps per WAN iteration (ElasticBSP §4, ZipLine's choice)
    local_steps: int | None = None
    #: the job's factor on the user's learning rate (STAR §IV-C's ADJUST_LR); the same at every site
    lr_scale: float | None = None
    #: inner steps per outer step (DiLoCo's H; 1 = per-step exchange), the same at every site
    outer_steps: int | None = None
    #: fragments of a streaming outer loop (1 = plain DiLoCo), the same at every site
    fragments: int | None = None
    #: the pseudo-gradient's value coding (:data:`OUTER_CODINGS`), the same at every site
    outer_coding: str | None = None
    #: the scheduler's KILL_RESTART order (AntDT §V-E3): this rank of the site restarts at the iteration
    restart: int | None = None

    def __post_init__(self) -> None:
        for name in TRAINER_KEYS:
            value = getattr(self, name)
            if value is not None:
                check_setting(name, value)
        _check_fragments(self.outer_steps, self.fragments)

    def __bool__(self) -> bool:
        return any(getattr(self, name) is not None for name in TRAINER_KEYS)

    def without_restart(self) -> TrainerSettings:
        """The same settings without the one-shot restart order (what later trainer sessions get)."""
        return dataclasses.replace(self, restart=None)

    def to_wire(self) -> dict[str, Any]:
        """A ConfigUpdate's values: the set fields under their names, in :data:`TRAINER_KEYS` order."""
        return {name: v for name in TRAINER_KEYS if (v := getattr(self, name)) is not None}

    @classmethod
    def from_wire(cls, values: Mapping[str, Any]) -> TrainerSettings:
        """A ConfigUpdate's (or a gateway's ``POST /config``) values; ConfigError names the first bad key
        (a plan key too: plans reach gateways only through the scheduler's :class:`JobSettings`), or
        ``values`` for none given."""
        _check_given(values)
        for key, value in values.items():
            if key not in TRAINER_KEYS:
                check_setting(key.partition(_AT)[0], value, key)  # a known key's own message, if any
                raise ConfigError(
                    f"{key}: not a trainer setting (trainer settings are {', '.join(TRAINER_KEYS)})",
                    key=key,
                    value=value,
                )
            check_setting(key, value)
        return cls(**dict(values))


@dataclass(frozen=True, slots=True)
class PlanSettings:
    """The gateways' WAN plan a decision sets (``None``: the gateway's configured or running value)."""

    topology: PlanTopology | None = None
    #: sites detached to a parent (STAR §IV-B); ``()`` = none (back to the base plan)
    stragglers: tuple[str, ...] | None = None
    #: how long a parent waits for its detached children, seconds
    t_w_s: float | None = None
    #: a root goes on once this many sites contributed (0 = wait for all)
    x_order: int | None = None
    #: seconds per round payload per site (STAR §IV-D2: the cheapest site becomes the tree's root)
    site_costs: Mapping[str, float] | None = None

    def __post_init__(self) -> None:
        if self.stragglers is not None:
            for name in self.stragglers:
                ok = isinstance(name, str) and bool(name.strip()) and not {_AT, ","} & set(name)
                check(ok, "stragglers", self.stragglers, "site names (empty: none)")
            object.__setattr__(self, "stragglers", parse_stragglers(",".join(self.stragglers)))
        if self.site_costs is not None:
            object.__setattr__(self, "site_costs", _frozen_map(self.site_costs, "site_costs"))
        for key, value in self._wire_items():
            check_setting(key, value)

    def __bool__(self) -> bool:
        return any(getattr(self, name) is not None for name in PLAN_KEYS)

    def _wire_items(self) -> Iterable[tuple[str, Any]]:
        for name in PLAN_KEYS:
            value = getattr(self, name)
            if value is None:
                continue
            if name == "stragglers":
                value = ",".join(value)
            elif name == "site_costs":
                value = ",".join(f"{s}:{_cost_text(float(c))}" for s, c in value.items())
            yield name, value

    def overlay(self, newer: PlanSettings) -> PlanSettings:
        """These settings with every field ``newer`` sets replaced."""
        return PlanSettings(*(_newer(getattr(newer, n), getattr(self, n)) for n in PLAN_KEYS))


def _check_fragments(outer_steps: int | None, fragments: int | None) -> None:
    """Streaming DiLoCo (arXiv 2501.18512 §2.2) syncs each fragment at its own inner step of the H, so a
    decision that sets both needs ``fragments <= outer_steps``."""
    if outer_steps is not None and fragments is not None:
        check(fragments <= outer_steps, "fragments", fragments, f"at most outer_steps ({outer_steps})")


def _check_given(values: Mapping[str, Any]) -> None:
    """A change of nothing is a caller's mistake (an empty ``POST /config``), not a no-op to announce."""
    if not values:
        raise ConfigError("no settings given", key="values")


def _newer(new: Any, old: Any) -> Any:
    return old if new is None else new


#: JobSettings' per-site map field of each per-site setting.
_SITE_FIELDS: Final = {name: f"site_{name}" for name in PER_SITE_KEYS}


@dataclass(frozen=True, slots=True)
class JobSettings:
    """One decision's values for the whole job (``None`` / an empty map: unchanged). A per-site value
    overrides the job-wide one at its site; ``site_restart`` exists only per site."""

    density: float | None = None
    staleness: int | None = None
    batch_size: int | None = None
    batch_weight: float | None = None
    local_steps: int | None = None
    lr_scale: float | None = None
    outer_steps: int | None = None
    fragments: int | None = None
    outer_coding: str | None = None
    #: per-rank batch size per site (AntDT-DD ADJUST_BS, Eq. 3; StellaTrain's per-rank batches)
    site_batch_size: Mapping[str, int] = field(default_factory=dict)
    #: each site's share of the job's samples × the site count, so the sum across sites averages samples
    site_batch_weight: Mapping[str, float] = field(default_factory=dict)
    #: local micro-steps per WAN iteration per site (ElasticBSP §4, ZipLine)
    site_local_steps: Mapping[str, int] = field(default_factory=dict)
    #: KILL_RESTART orders (AntDT §V-E3): the rank of each named site to restart (one-shot)
    site_restart: Mapping[str, int] = field(default_factory=dict)
    plan: PlanSettings = field(default_factory=PlanSettings)

    def __post_init__(self) -> None:
        for name in TRAINER_KEYS:
            if name != RESTART_KEY and (value := getattr(self, name)) is not None:
                check_setting(name, value)
        for name, attr in _SITE_FIELDS.items():
            per_site = _frozen_map(getattr(self, attr), attr)
            object.__setattr__(self, attr, per_site)
            for site, value in per_site.items():
                check_setting(name, value, f"{name}{_AT}{site}")
        if not isinstance(self.plan, PlanSettings):
            raise ConfigError("plan must be PlanSettings", key="plan", value=type(self.plan).__name__)
        _check_fragments(self.outer_steps, self.fragments)

    def __bool__(self) -> bool:
        return (
            bool(self.plan)
            or any(getattr(self, n) is not None for n in TRAINER_KEYS if n != RESTART_KEY)
            or any(getattr(self, a) for a in _SITE_FIELDS.values())
        )

    # -- views -----------------------------------------------------------------------------------------

    def sites(self) -> set[str]:
        """Every site a per-site value names (not the plan's: its names are checked by the gateways)."""
        return {s for attr in _SITE_FIELDS.values() for s in getattr(self, attr)}

    def per_site_values(self) -> Iterator[tuple[str, str, Any]]:
        """(setting, site, value) of every per-site value, in wire order."""
        for name, attr in _SITE_FIELDS.items():
            for site, value in getattr(self, attr).items():
                yield name, site, value

    def for_site(self, site: str) -> TrainerSettings:
        """What ``site``'s trainers take: the job-wide values, overridden by ``site``'s own per-site ones
        (the other sites' are dropped; a restart order only if it names ``site``)."""
        own = {name: getattr(self, attr).get(site) for name, attr in _SITE_FIELDS.items()}
        return TrainerSettings(
            density=self.density,
            staleness=self.staleness,
            batch_size=_newer(own["batch_size"], self.batch_size),
            batch_weight=_newer(own["batch_weight"], self.batch_weight),
            local_steps=_newer(own["local_steps"], self.local_steps),
            lr_scale=self.lr_scale,
            outer_steps=self.outer_steps,
            fragments=self.fragments,
            outer_coding=self.outer_coding,
            restart=own[RESTART_KEY],
        )

    # -- combining -------------------------------------------------------------------------------------

    def overlay(self, newer: JobSettings) -> JobSettings:
        """These settings with what ``newer`` sets replaced: a field it sets, and each site's value it
        sets (the other sites keep theirs) — how a decision carries the running one's values on."""
        kw: dict[str, Any] = {
            n: _newer(getattr(newer, n), getattr(self, n)) for n in TRAINER_KEYS if n != RESTART_KEY
        }
        for attr in _SITE_FIELDS.values():
            kw[attr] = {**getattr(self, attr), **getattr(newer, attr)}
        return JobSettings(**kw, plan=self.plan.overlay(newer.plan))

    def held_over(self, policy: JobSettings) -> JobSettings:
        """``policy``'s settings with these (an operator's held values) in force: a held job-wide value
        also drops the policy's per-site values of that setting (the operator set it for every site)."""
        kw: dict[str, Any] = {}
        for name in TRAINER_KEYS:
            attr = _SITE_FIELDS.get(name)
            if name != RESTART_KEY:
                kw[name] = _newer(getattr(self, name), getattr(policy, name))
            if attr is not None:
                mine, theirs = getattr(self, attr), getattr(policy, attr)
                base = {} if name != RESTART_KEY and getattr(self, name) is not None else theirs
                kw[attr] = {**base, **mine}
        return JobSettings(**kw, plan=policy.plan.overlay(self.plan))

    def without_restarts(self) -> JobSettings:
        """The same settings without KILL_RESTART orders (one-shot: never carried into the next decision)."""
        return dataclasses.replace(self, site_restart={})

    def without(self, keys: Iterable[str]) -> JobSettings:
        """These settings without the wire-named ``keys`` (``batch_size``, ``batch_size@a``: what an
        operator releases by name)."""
        drop = set(keys)
        return JobSettings._read({k: v for k, v in self.to_wire().items() if k not in drop})

    # -- the wire's flat form (the only place it is written or read) ------------------------------------

    def to_wire(self) -> dict[str, Any]:
        """The flat map an Announce, ``POST /config`` and the decisions file carry: job-wide settings
        under their names, then each per-site value as ``<key>@<site>`` (sites by name), then the plan
        (stragglers comma-joined, costs as ``site:seconds`` pairs)."""
        out: dict[str, Any] = {
            n: v for n in TRAINER_KEYS if n != RESTART_KEY and (v := getattr(self, n)) is not None
        }
        for name, attr in _SITE_FIELDS.items():
            out.update({f"{name}{_AT}{site}": v for site, v in getattr(self, attr).items()})
        out.update(self.plan._wire_items())
        return out

    @classmethod
    def from_wire(cls, values: Mapping[str, Any]) -> JobSettings:
        """The settings of a flat map (see :meth:`to_wire`); ConfigError names the first bad key: an
        unknown setting, a value out of bounds, a per-site form of a setting that has none (``lr_scale@a``
        is job-wide; ``density@a`` would be dropped at every site without a word), a restart without
        its site, or ``values`` for none given."""
        _check_given(values)
        return cls._read(values)

    @classmethod
    def _read(cls, values: Mapping[str, Any]) -> JobSettings:
        kw: dict[str, Any] = {attr: {} for attr in _SITE_FIELDS.values()}
        plan: dict[str, Any] = {}
        for key, value in values.items():
            name, at, site = key.partition(_AT)
            if at:
                if name in JOB_WIDE_KEYS:
                    raise ConfigError(
                        f"{key}: {name} is one value for the whole job, never per site (every site "
                        f"applies the same aggregated update: a learning rate or an outer-loop mode that "
                        f"differed would make the sites' parameters diverge); set {name} without @<site>",
                        key=key,
                        value=value,
                    )
                check_setting(name, value, key)
                if name not in _SITE_FIELDS:
                    raise ConfigError(f"{key}: {name} has no per-site form", key=key, value=value)
                check(bool(site) and _AT not in site, key, value, "<key>@<site> names one site")
                kw[_SITE_FIELDS[name]][site] = value
                continue
            check_setting(name, value)
            if name == RESTART_KEY:
                raise ConfigError(
                    f"{key}: a restart names its site ({key}@<site>) and is ordered by the scheduler's "
                    "straggler policy only",
                    key=key,
                    value=value,
                )
            if name == "stragglers":
                plan[name] = parse_stragglers(value)
            elif name == "site_costs":
                plan[name] = parse_site_costs(value)
            elif name in PLAN_KEYS:
                plan[name] = value
            else:
                kw[name] = value
        return cls(**kw, plan=PlanSettings(**plan))


def site_key(name: str, site: str) -> str:
    """The wire name of ``site``'s value of per-site setting ``name`` (``batch_size@a``): what an error
    names when it refuses what an operator sent."""
    check(name in _SITE_FIELDS, "name", name, f"per-site settings are {', '.join(PER_SITE_KEYS)}")
    return f"{name}{_AT}{site}"


def per_site(values: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Each site's value of per-site setting ``name`` in a flat map that holds more than settings (a demo
    result's settings timeline, read from the decisions file): the reader's half of :meth:`JobSettings.
    to_wire` for one setting, unvalidated (the file is this package's own record, not a peer's)."""
    check(name in _SITE_FIELDS, "name", name, f"per-site settings are {', '.join(PER_SITE_KEYS)}")
    prefix = f"{name}{_AT}"
    return {k[len(prefix) :]: v for k, v in values.items() if k.startswith(prefix)}
