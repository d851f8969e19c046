"""Settings of ``wanrt profile`` (Algorithm 1), one frozen dataclass (TOML section ``[profile]``).

Paper values where StellaTrain gives them (§4.3: N = 30 Bayesian-optimisation steps, r in [0, 0.999], EI as
the acquisition function); the probe recipe is ours, sized so that a whole profile of the demo model runs in
about a minute on two CPU cores (``QUICK``: seconds).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Final, Literal

from scheduler.profile.probe_settings import ProbeSettings
from wanrt.config import check

__all__ = ["QUICK", "SECTION", "ProfileConfig", "RSampling"]

SECTION: Final = "profile"

#: how the random r of each BO step is drawn: uniformly in r (the paper's line 14), or uniformly in
#: −log10(1 − r), i.e. log-uniform in density: uniform r puts 90 % of the probes below r = 0.9, while the
#: decisions of a WAN job live between 0.9 and 0.999
RSampling = Literal["uniform", "log_density"]


@dataclass(frozen=True)
class ProfileConfig:
    #: Bayesian-optimisation steps N (Algorithm 1 line 13; the paper finds 30 enough)
    probes: int = 30
    #: of those, the first ones take a random batch too (EI has nothing to rank before there is data)
    init_probes: int = 5
    r_min: float = 0.0
    r_max: float = 0.999
    r_sampling: RSampling = "log_density"
    #: total batch range [x_min, x_max] of Algorithm 1 (the paper's is 4..1024 for ImageNet; the demo's
    #: 1437 training images make batches beyond 512 a handful of steps per epoch)
    min_total_batch: int = 8
    max_total_batch: int = 512
    #: integer batch candidates (log-spaced) over which EI is maximised for the drawn r
    batch_candidates: int = 128
    #: EI's exploration margin ξ, in units of the modelled log loss ratio
    ei_xi: float = 0.01
    #: restarts of the GP's marginal-likelihood optimiser (sklearn's n_restarts_optimizer)
    gp_restarts: int = 2
    #: measure the staleness penalty (one extra probe at staleness 1, r = 0, the middle batch)
    measure_staleness: bool = True
    seed: int = 0
    probe: ProbeSettings = field(default_factory=ProbeSettings)

    def __post_init__(self) -> None:
        check(isinstance(self.probes, int) and 1 <= self.probes <= 1000, "probes", self.probes, "in 1..1000")
        check(
            isinstance(self.init_probes, int) and 1 <= self.init_probes <= self.probes,
            "init_probes",
            self.init_probes,
            "must be in 1..probes",
        )
        check(0.0 <= self.r_min < self.r_max < 1.0, "r_max", self.r_max, "need 0 <= r_min < r_max < 1")
        check(
            self.r_sampling in ("uniform", "log_density"),
            "r_sampling",
            self.r_sampling,
            "one of 'uniform', 'log_density'",
        )
        check(
            isinstance(self.min_total_batch, int) and self.min_total_batch >= 1,
            "min_total_batch",
            self.min_total_batch,
            "must be an integer >= 1",
        )
        check(
            isinstance(self.max_total_batch, int) and self.max_total_batch > self.min_total_batch,
            "max_total_batch",
            self.max_total_batch,
            "must be an integer > min_total_batch",
        )
        check(
            isinstance(self.batch_candidates, int) and 2 <= self.batch_candidates <= 100_000,
            "batch_candidates",
            self.batch_candidates,
            "in 2..100000",
        )
        check(0.0 <= self.ei_xi <= 10.0, "ei_xi", self.ei_xi, "must be in [0, 10]")
        check(
            isinstance(self.gp_restarts, int) and 0 <= self.gp_restarts <= 50,
            "gp_restarts",
            self.gp_restarts,
            "in 0..50",
        )
        check(0 <= self.seed < 2**31, "seed", self.seed, "must be in 0..2**31-1")

    @property
    def middle_batch(self) -> int:
        """Algorithm 1 line 12's baseline batch, (x_min + x_max) / 2."""
        return (self.min_total_batch + self.max_total_batch) // 2


#: seconds instead of a minute: a smaller MLP, two epochs per probe, a narrower batch range
QUICK: Final = ProfileConfig(
    max_total_batch=256,
    probe=dataclasses.replace(ProbeSettings(), hidden=64, samples=2874),
)
