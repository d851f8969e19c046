"""A simulation scenario (``wanrt sim SCENARIO.toml``): frozen, validated config dataclasses.

Layout (every table optional; defaults give a 4-site star-free tree on 100 Mbit/s links)::

    [sim]                 Scenario: name, seed, sites or names, iterations, staleness, sampling
    [sim.payload]         PayloadSpec: layers and their sizes, density, block size
    [sim.compute]         ComputeSpec: constant / normal / trace compute times, backward fraction
    [sim.compute.slow]    site -> factor (a slow site ×k)
    [sim.network]         LinkSpec: every link's rate, delay, jitter, loss, send buffer, trace file
    [sim.profile]         ProfileSpec: a seed-002 link profile (uniform, straggler, variable, bursty)
    [[sim.links]]         LinkOverride: one link (both directions) differing from [sim.network]
    [sim.gateway]         GatewaySpec: what every simulated gateway runs with (pacer base rate, root,
                          links = "all" | "plan", and the gateway's own [rounds] [edf] [rates] [timeouts])

Loaded with :func:`wanrt.config.from_mapping`, so a bad value is a :class:`~wanrt.errors.ConfigError`
naming its key (``sim.network.loss``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

from gateways.rounds.config import RoundConfig
from gateways.sending.config import EdfConfig, RateConfig
from transports.timeouts import Timeouts
from wanrt.config import check, from_mapping, load_toml
from wanrt.errors import ConfigError
from wanrt.protocol.limits import MAX_SITES

__all__ = [
    "MAX_SIM_SITES",
    "ComputeSpec",
    "GatewaySpec",
    "LinkOverride",
    "LinkSpec",
    "PayloadSpec",
    "ProfileSpec",
    "Scenario",
    "load_scenario",
]

#: Sites one scenario may simulate: far beyond the 1 000-site scale target, small enough that a typo
#: (an extra zero) fails at once instead of exhausting memory.
MAX_SIM_SITES: Final = 10_000

#: Liveness settings of simulated gateways unless the scenario says otherwise: the daemons' defaults.
SIM_TIMEOUTS: Final = Timeouts()


@dataclass(frozen=True)
class PayloadSpec:
    """What each trainer pushes per iteration: ``layers`` layers of ``dense_len`` elements (or ``sizes``,
    one dense length per layer), keeping ``density`` of the 16-float blocks."""

    layers: int = 4
    dense_len: int = 65536
    sizes: tuple[int, ...] = ()
    density: float = 0.01
    block_size: int = 16
    same_blocks: bool = False

    def __post_init__(self) -> None:
        check(1 <= self.layers <= 4096, "layers", self.layers, "1..4096")
        check(1 <= self.dense_len <= 1 << 28, "dense_len", self.dense_len, "1..2**28 elements")
        for i, n in enumerate(self.sizes):
            check(1 <= n <= 1 << 28, f"sizes[{i}]", n, "1..2**28 elements")
        check(len(self.sizes) <= 4096, "sizes", len(self.sizes), "at most 4096 layers")
        check(0 < self.density <= 1, "density", self.density, "0 < d <= 1")
        check(self.block_size in (1, 16), "block_size", self.block_size, "1 or 16")

    def layer_sizes(self) -> tuple[int, ...]:
        return self.sizes if self.sizes else (self.dense_len,) * self.layers


@dataclass(frozen=True)
class ComputeSpec:
    """Per-iteration compute time (see :mod:`sims.des.compute`); ``backward_fraction`` of it is the
    backward pass, during which layers are pushed last-first as their gradients become ready (0: every
    layer is pushed when compute ends)."""

    model: Literal["constant", "normal", "trace"] = "constant"
    mean_s: float = 0.1
    sd_s: float = 0.0
    trace: tuple[float, ...] = ()
    slow: Mapping[str, float] = field(default_factory=dict)
    backward_fraction: float = 0.0

    def __post_init__(self) -> None:
        check(0 <= self.mean_s <= 3600, "mean_s", self.mean_s, "0..3600 s")
        check(0 <= self.sd_s <= 3600, "sd_s", self.sd_s, "0..3600 s")
        check(self.model != "trace" or len(self.trace) > 0, "trace", self.trace, "model 'trace' needs times")
        for i, t in enumerate(self.trace):
            check(0 <= t <= 3600, f"trace[{i}]", t, "0..3600 s")
        for site, k in self.slow.items():
            check(0 < k <= 1000, f"slow.{site}", k, "a factor in (0, 1000]")
        check(0 <= self.backward_fraction <= 1, "backward_fraction", self.backward_fraction, "0..1")


@dataclass(frozen=True)
class LinkSpec:
    """One link's model (both directions alike); see :mod:`sims.des.link`. ``trace`` is a bandwidth
    trace file (resolved relative to the scenario file) driving the rate from t = 0."""

    rate_bps: float = 100e6
    delay_s: float = 0.01
    jitter_s: float = 0.0
    loss: float = 0.0
    buffer_bytes: int = 256 * 1024
    trace: str | None = None
    follow_pacer: bool = False

    def __post_init__(self) -> None:
        check(1e3 <= self.rate_bps <= 1e13, "rate_bps", self.rate_bps, "1e3..1e13 bit/s")
        check(0 <= self.delay_s <= 10, "delay_s", self.delay_s, "0..10 s")
        check(0 <= self.jitter_s <= 10, "jitter_s", self.jitter_s, "0..10 s")
        check(0 <= self.loss < 1, "loss", self.loss, "a probability per write, 0 <= p < 1")
        check(1024 <= self.buffer_bytes <= 1 << 30, "buffer_bytes", self.buffer_bytes, "1 KiB..1 GiB")
        check(self.trace != "", "trace", self.trace, "a file path")


@dataclass(frozen=True)
class LinkOverride(LinkSpec):
    """``[[sim.links]]``: the link between sites ``a`` and ``b`` (both directions)."""

    a: str = ""
    b: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(bool(self.a) and bool(self.b) and self.a != self.b, "a", (self.a, self.b), "two site names")


@dataclass(frozen=True)
class ProfileSpec:
    """A seed-002 link profile (:func:`transports.traces.profile_traces`) applied to every link the
    plan uses, in both directions; ``straggler`` names the site whose link to its parent is the slow
    one (default: the first such link). ``none`` leaves the links at their configured rates."""

    kind: Literal["none", "uniform", "straggler", "variable", "bursty"] = "none"
    step_s: float = 1.0
    duration_s: float = 3600.0
    straggler: str = ""
    slowdown: float = 3.0
    sigma: float = 0.2
    burst_factor: float = 5.0
    burst_prob: float = 0.2

    def __post_init__(self) -> None:
        check(0 < self.step_s <= 3600, "step_s", self.step_s, "0 < s <= 3600")
        check(self.step_s <= self.duration_s <= 1e7, "duration_s", self.duration_s, "step_s..1e7 s")
        check(1 <= self.slowdown <= 1000, "slowdown", self.slowdown, "1..1000")
        check(0 <= self.sigma <= 10, "sigma", self.sigma, "0..10")
        check(1 <= self.burst_factor <= 1000, "burst_factor", self.burst_factor, "1..1000")
        check(0 <= self.burst_prob <= 1, "burst_prob", self.burst_prob, "0..1")


@dataclass(frozen=True)
class GatewaySpec:
    """What every simulated gateway is configured with (the rest of its GatewayConfig is generated):
    ``link_rate_bps`` is the pacer's base rate per peer, ``links`` which peers it expects links to."""

    link_rate_bps: float = 100e6
    root: str | None = None
    links: Literal["all", "plan"] = "all"
    rounds: RoundConfig = field(default_factory=RoundConfig)
    edf: EdfConfig = field(default_factory=EdfConfig)
    rates: RateConfig = field(default_factory=RateConfig)
    timeouts: Timeouts = field(default_factory=lambda: SIM_TIMEOUTS)

    def __post_init__(self) -> None:
        check(0 < self.link_rate_bps <= 1e13, "link_rate_bps", self.link_rate_bps, "(0, 1e13] bit/s")


@dataclass(frozen=True)
class Scenario:
    """``[sim]``: the run. ``sites`` generated names ``s000``… unless ``names`` lists them;
    ``staleness`` is how many iterations a trainer may run ahead of its aggregates (0 or 1);
    ``sample_interval_s`` the period of the link/frontier time series (0: none);
    """

    name: str = "scenario"
    seed: int = 0
    sites: int = 4
    names: tuple[str, ...] = ()
    iterations: int = 20
    staleness: int = 0
    sample_interval_s: float = 0.05
    max_time_s: float = 86400.0
    payload: PayloadSpec = field(default_factory=PayloadSpec)
    compute: ComputeSpec = field(default_factory=ComputeSpec)
    network: LinkSpec = field(default_factory=LinkSpec)
    profile: ProfileSpec = field(default_factory=ProfileSpec)
    links: tuple[LinkOverride, ...] = ()
    gateway: GatewaySpec = field(default_factory=GatewaySpec)

    def __post_init__(self) -> None:
        check(0 <= self.seed < 1 << 63, "seed", self.seed, "0..2**63-1")
        if self.names:
            object.__setattr__(self, "sites", len(self.names))
            check(len(set(self.names)) == len(self.names), "names", self.names, "distinct site names")
        check(1 <= self.sites <= MAX_SIM_SITES, "sites", self.sites, f"1..{MAX_SIM_SITES}")
        check(1 <= self.iterations <= 1_000_000, "iterations", self.iterations, "1..1e6")
        check(self.staleness in (0, 1), "staleness", self.staleness, "0 or 1 (StellaTrain §3.3)")
        check(0 <= self.sample_interval_s <= 3600, "sample_interval_s", self.sample_interval_s, "0..3600 s")
        check(0 < self.max_time_s <= 1e9, "max_time_s", self.max_time_s, "0 < s <= 1e9 (virtual)")
        check(self.sites <= MAX_SITES, "sites", self.sites, f"the wire protocol allows {MAX_SITES} sites")
        names = set(self.site_names())
        for site in self.compute.slow:
            check(site in names, f"compute.slow.{site}", site, "not a site of this scenario")
        for i, link in enumerate(self.links):
            for end in ("a", "b"):
                value = getattr(link, end)
                check(value in names, f"links[{i}].{end}", value, "not a site of this scenario")
        root = self.gateway.root
        check(root is None or root in names, "gateway.root", root, "not a site of this scenario")
        check(
            not self.profile.straggler or self.profile.straggler in names,
            "profile.straggler",
            self.profile.straggler,
            "not a site of this scenario",
        )

    def site_names(self) -> tuple[str, ...]:
        if self.names:
            return tuple(sorted(self.names))
        width = max(3, len(str(self.sites - 1)))
        return tuple(f"s{i:0{width}d}" for i in range(self.sites))

    def replace(self, **changes: object) -> Scenario:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


def _resolve_traces(sc: Scenario, base: Path) -> Scenario:
    def fix(spec: LinkSpec, key: str) -> str | None:
        if spec.trace is None:
            return None
        p = Path(spec.trace).expanduser()
        p = p if p.is_absolute() else (base / p)
        if not p.is_file():
            raise ConfigError(f"trace file not found: {p}", key=key, value=spec.trace)
        return str(p)

    network = dataclasses.replace(sc.network, trace=fix(sc.network, "sim.network.trace"))
    links = tuple(
        dataclasses.replace(o, trace=fix(o, f"sim.links[{i}].trace")) for i, o in enumerate(sc.links)
    )
    return dataclasses.replace(sc, network=network, links=links)


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file; trace paths are taken relative to it."""
    p = Path(path)
    data = load_toml(p)
    unknown = sorted(set(data) - {"sim"})
    if unknown:
        raise ConfigError(f"unknown top-level table {unknown[0]!r}; expected [sim]", key=unknown[0])
    if "sim" not in data:
        raise ConfigError(f"{p}: missing [sim] table", key="sim", path=str(p))
    sc = from_mapping(Scenario, data["sim"], section="sim")
    return _resolve_traces(sc, p.resolve().parent)
