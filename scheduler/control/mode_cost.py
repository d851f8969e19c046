"""The mode choice's cost model: time per unit of training progress for per-step sparse exchange, DiLoCo
with H inner steps, and Streaming DiLoCo with F fragments, each with its value coding (docs/scheduler.md,
"The mode choice").

Why a second model beside StellaTrain's (scheduler/control/search.py): StellaTrain §4.2 prices one
exchange *per iteration* and trades its density against compute (Eq. 6). An outer loop changes what an
iteration costs — one exchange per H inner steps (DiLoCo, arXiv 2311.08105 Algorithm 1), or a fragment's
exchange hidden behind the next inner steps (Streaming DiLoCo, arXiv 2501.18512 §2.2–2.3) — and what an
iteration is worth (an outer loop needs a different number of inner steps to the same loss). So the unit
here is *seconds per unit of progress*:

    cost(mode) = iteration_s(mode) × steps_factor(mode)

``iteration_s`` is compute plus the exchange time the mode leaves exposed; ``steps_factor`` is the mode's
inner steps to the target over per-step exchange's (measured, :data:`scheduler.control.mode_config.
MEASURED_STEPS_FACTOR`; per-step exchange is 1 by definition). Per mode, with ``t`` the compute of one inner
step (slowest site), ``e(d, c)`` the exchange of a payload at density ``d`` in coding ``c``:

* per-step: ``t + e`` (staleness 0) or ``max(t, e)`` (staleness 1: StellaTrain §3.3's overlap);
* DiLoCo(H, c): ``t + e(d_c, c) / H`` — the exchange blocks every site once per H steps;
* streaming(H, F, c): each of the F fragments (1/F of the parameters) is exchanged once per H steps and
  may overlap ``τ`` inner steps: ``max(t + F · max(0, e_F − τ·t) / H, F · e_F / H)`` with ``e_F`` one
  fragment's exchange (the second term: the link must carry F fragments per H steps).

``e(d, c) = L + 8 · (up + down) / B``: the payload up at the site's coding and the sum of the sites'
payloads down (its support the union ``1 − (1 − d)^S`` of S sites' selections, its values at
``sum_value_bytes``: the gateways sum in fp32), over the estimator's bandwidth B, plus the round's fixed
latency L. Payload bytes per selected value are the codec's: fp32 4, fp16 2, int8/int4/int2 ``b/8 + 1 /
scale_block`` (docs/codec.md), plus the block index at its entropy bound ``H₂(d) / (8 · d · block)``
(the Rice index reaches it within 0.3 %; the varint index of float payloads costs 1.26× it, measured at
1 %: 0.0795 against 0.0631 bytes per value, tools/bench_lowbit.py). Sans-IO and pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from scheduler.control.mode_config import Mode, ModeConfig
from wanrt.config import check

__all__ = [
    "LinkState",
    "ModeCandidate",
    "candidates",
    "exchange_bytes",
    "payload_bytes",
    "value_bytes",
]

_VALUE_BITS: Final = {"fp32": 32, "fp16": 16, "bf16": 16, "int8": 8, "int4": 4, "int2": 2}
_LOWBIT: Final = ("int8", "int4", "int2")
#: the float payloads' varint index over the entropy bound, at density 0.01 (tools/bench_lowbit.py)
VARINT_OVER_BOUND: Final = 0.0795 / 0.0631


def value_bytes(coding: str, scale_block: int) -> float:
    """Bytes per sent value: the value's bits, and for low-bit codes one scale byte per ``scale_block``."""
    bits = _VALUE_BITS[coding]
    return bits / 8.0 + (1.0 / scale_block if coding in _LOWBIT else 0.0)


def index_bytes(density: float, coding: str, block: int) -> float:
    """Bytes of block index per sent value at ``density`` (0 for a dense payload)."""
    if density >= 1.0:
        return 0.0
    h2 = -(density * math.log2(density) + (1 - density) * math.log2(1 - density))
    bound = h2 / (8.0 * density * block)
    return bound if coding in _LOWBIT else bound * VARINT_OVER_BOUND


def payload_bytes(n: float, density: float, coding: str, cfg: ModeConfig) -> float:
    """One site's payload of ``n`` values at ``density`` in ``coding``."""
    d = min(1.0, density)
    return n * d * (value_bytes(coding, cfg.scale_block) + index_bytes(d, coding, cfg.block_size))


def exchange_bytes(n: float, density: float, coding: str, sites: int, cfg: ModeConfig) -> float:
    """A site's WAN bytes for one exchange: its payload up and the job's sum down (see the module doc)."""
    up = payload_bytes(n, density, coding, cfg)
    if sites <= 1:
        return up
    union = 1.0 - (1.0 - min(1.0, density)) ** sites
    per_value = cfg.sum_value_bytes + index_bytes(union, "fp32", cfg.block_size)
    return up + n * union * per_value


@dataclass(frozen=True, slots=True)
class LinkState:
    """What the cost model is evaluated at: the scheduler's measurements and the job's shape."""

    #: the estimator's WAN bandwidth (Eq. 6's B), bit/s
    bandwidth_bps: float
    #: compute of one inner step at the slowest site, seconds
    compute_s: float
    #: the model's parameters
    n_params: int
    sites: int
    #: the round's fixed cost (round trips, the gateways' turnaround), seconds
    latency_s: float = 0.0
    #: the per-step exchange's density and staleness bound in force (the StellaTrain policy's choice)
    per_step_density: float = 0.02
    staleness: int = 1

    def __post_init__(self) -> None:
        check(
            math.isfinite(self.bandwidth_bps) and self.bandwidth_bps > 0,
            "bandwidth_bps",
            self.bandwidth_bps,
            "> 0",
        )
        check(math.isfinite(self.compute_s) and self.compute_s > 0, "compute_s", self.compute_s, "> 0")
        check(self.n_params >= 1, "n_params", self.n_params, ">= 1")
        check(self.sites >= 1, "sites", self.sites, ">= 1")
        check(math.isfinite(self.latency_s) and self.latency_s >= 0, "latency_s", self.latency_s, ">= 0")
        check(0 < self.per_step_density <= 1, "per_step_density", self.per_step_density, "in (0, 1]")


@dataclass(frozen=True, slots=True)
class ModeCandidate:
    """One mode, its settings, and what the model predicts for it."""

    mode: Mode
    outer_steps: int
    fragments: int
    coding: str
    #: seconds per inner step: compute plus the exposed exchange
    iteration_s: float
    #: inner steps to the target over per-step exchange's (measured, 1 for per-step)
    steps_factor: float
    #: a site's WAN bytes per inner step
    bytes_per_step: float

    @property
    def cost_s(self) -> float:
        """Seconds per unit of progress: the quantity the choice minimises."""
        return self.iteration_s * self.steps_factor

    @property
    def label(self) -> str:
        if self.mode == "per_step":
            return f"per_step {self.coding}"
        if self.mode == "diloco":
            return f"diloco H={self.outer_steps} {self.coding}"
        return f"streaming H={self.outer_steps} F={self.fragments} {self.coding}"


def _exchange_s(nbytes: float, s: LinkState) -> float:
    return s.latency_s + 8.0 * nbytes / s.bandwidth_bps


def per_step(s: LinkState, cfg: ModeConfig) -> ModeCandidate:
    nbytes = exchange_bytes(s.n_params, s.per_step_density, cfg.per_step_coding, s.sites, cfg)
    e = _exchange_s(nbytes, s)
    t = max(s.compute_s, e) if s.staleness >= 1 else s.compute_s + e
    return ModeCandidate("per_step", 1, 1, cfg.per_step_coding, t, 1.0, nbytes)


def diloco(s: LinkState, cfg: ModeConfig, h_index: int, coding: str) -> ModeCandidate:
    h = cfg.outer_steps[h_index]
    nbytes = exchange_bytes(s.n_params, cfg.outer_density[coding], coding, s.sites, cfg)
    t = s.compute_s + _exchange_s(nbytes, s) / h
    return ModeCandidate("diloco", h, 1, coding, t, cfg.steps_factor[coding][h_index], nbytes / h)


def streaming(s: LinkState, cfg: ModeConfig, h_index: int, fragments: int, coding: str) -> ModeCandidate:
    h = cfg.outer_steps[h_index]
    nbytes = exchange_bytes(s.n_params / fragments, cfg.outer_density[coding], coding, s.sites, cfg)
    e_f = _exchange_s(nbytes, s)
    stall = fragments * max(0.0, e_f - cfg.overlap_steps * s.compute_s) / h
    t = max(s.compute_s + stall, fragments * e_f / h)
    factor = cfg.steps_factor[coding][h_index] * cfg.stream_factor
    return ModeCandidate("streaming", h, fragments, coding, t, factor, fragments * nbytes / h)


def candidates(s: LinkState, cfg: ModeConfig) -> list[ModeCandidate]:
    """Every mode the configuration allows, in a fixed order (per-step first, then by H, F, coding): the
    order breaks ties, so the choice is deterministic."""
    out: list[ModeCandidate] = []
    if "per_step" in cfg.modes:
        out.append(per_step(s, cfg))
    for i, h in enumerate(cfg.outer_steps):
        for c in cfg.codings:
            if "diloco" in cfg.modes:
                out.append(diloco(s, cfg, i, c))
            if "streaming" in cfg.modes:
                out.extend(streaming(s, cfg, i, f, c) for f in cfg.fragments if f <= h)
    return out
