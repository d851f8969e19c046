"""How long each site's trainers compute one iteration (forward + backward), on virtual time.

Models (``[sim.compute] model``): ``constant`` (``mean_s``), ``normal`` (N(mean_s, sd_s²) clipped at 10 %
of the mean, so a draw never means free compute), ``trace`` (per-iteration times, cycled). Any model is
multiplied by a per-site factor (``[sim.compute.slow]``: a slow site ×k, the seed-002/STAR persistent
straggler). Each draw is seeded by (scenario seed, site, iteration), so it depends on nothing else.
"""

from __future__ import annotations

import numpy as np

from sims.des.scenario import ComputeSpec

__all__ = ["ComputeModel"]


class ComputeModel:
    """Compute time of (site, iteration); deterministic per seed."""

    def __init__(self, spec: ComputeSpec, sites: tuple[str, ...], seed: int) -> None:
        self.spec = spec
        self._index = {s: i for i, s in enumerate(sites)}
        self._seed = seed

    def time(self, site: str, iteration: int) -> float:
        spec = self.spec
        if spec.model == "constant":
            base = spec.mean_s
        elif spec.model == "normal":
            rng = np.random.default_rng([self._seed, 7, self._index[site], iteration])
            base = max(float(rng.normal(spec.mean_s, spec.sd_s)), 0.1 * spec.mean_s)
        else:
            base = spec.trace[iteration % len(spec.trace)]
        return base * spec.slow.get(site, 1.0)
