"""The older single-purpose models as uses of the simulator: the same headline quantity, both ways.

* **EDF first-layer speedup** (StellaTrain §3.3; :mod:`sims.models.edf_link`): two sites in a star,
  both trainers push 16 VGG-like layers last-first across their backward pass. The root's trainer
  gets layer 0's aggregate when the child's layer-0 partial has crossed the child's uplink (the root's
  own push is local), so that time is :func:`sims.models.edf_link.run_pipeline`'s ``arrival_s[0]``
  for the same byte sizes, rate and backward time. Speedup = FIFO time / EDF time, with
  ``[gateway.edf] policy`` switched. The DES adds frame headers, chunk envelopes, the send buffer
  and pacing, which the model does not have.
* **Seed-002 persistent straggler** (:mod:`sims.models.fluid_round`): the packaged
  ``straggler-seed002`` scenario (a star, link a↔d 3× slower, capacity following the root's pacer) run
  with the RateAllocator inside the real nodes on and off; change = mean iteration time on / off − 1.
  The fluid model's change is for the same compute/communication split. Known difference: a node
  reports an iteration's link times only when the iteration can no longer change (acks in), while
  the fluid model's allocator sees every iteration at once.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from gateways.rounds.config import RoundConfig
from gateways.sending.config import EdfConfig, RateConfig
from gateways.sending.edf_queue import EdfQueue, FifoQueue
from sims.des.payloads import make_payload
from sims.des.scenario import ComputeSpec, GatewaySpec, LinkSpec, PayloadSpec, Scenario, load_scenario
from sims.des.world import Simulation
from sims.models.edf_link import run_pipeline, vgg_like_layers
from sims.models.fluid_round import simulate
from wanrt.codec.payload_codec import encode_payload

__all__ = ["EdfCheck", "StragglerCheck", "edf_check", "edf_scenario", "straggler_check"]

#: Bytes per element of a dense (density 1) fp32 payload with 16-float blocks: 4 for the value and
#: 8/16 for the block index.
_BYTES_PER_ELEMENT = 4.5


def edf_scenario(policy: str, *, total_bytes: int = 16 << 20, mbit: float = 100.0) -> Scenario:
    """Two sites; site ``b``'s 16 layers (``total_bytes`` of payload) cross a ``mbit`` uplink to ``a``."""
    sizes = tuple(max(16, int(s / _BYTES_PER_ELEMENT) // 16 * 16) for s in vgg_like_layers(16, total_bytes))
    rate = mbit * 1e6 / 8
    comm = sum(sizes) * _BYTES_PER_ELEMENT / rate
    backward_s = 0.6 * comm  # edf_link's split: compute about as long as the transfer
    return Scenario(
        name=f"edf-{policy}",
        names=("a", "b"),
        iterations=1,
        sample_interval_s=0.0,
        payload=PayloadSpec(sizes=sizes, density=1.0),
        compute=ComputeSpec(mean_s=backward_s, backward_fraction=1.0),
        network=LinkSpec(rate_bps=mbit * 1e6, delay_s=0.0, buffer_bytes=64 << 10),
        gateway=GatewaySpec(
            root="a",
            link_rate_bps=1e12,  # the pacer never limits: the link does
            rounds=RoundConfig(topology="star", round_deadline_s=600.0, t_w_s=600.0, suspect_after_s=600.0),
            edf=EdfConfig(policy=policy),  # type: ignore[arg-type]
        ),
    )


@dataclass(frozen=True)
class EdfCheck:
    des_fifo_s: float
    des_edf_s: float
    model_fifo_s: float
    model_edf_s: float

    @property
    def des_speedup(self) -> float:
        return self.des_fifo_s / self.des_edf_s

    @property
    def model_speedup(self) -> float:
        return self.model_fifo_s / self.model_edf_s


def _first_layer_at_child(policy: str, **kw: object) -> tuple[float, Scenario]:
    sc = edf_scenario(policy, **kw)  # type: ignore[arg-type]
    r = Simulation(sc).run()
    return r.aggregates[("a", 0, 0)][0] - r.iteration_start["b"][0], sc


def edf_check(*, total_bytes: int = 16 << 20, mbit: float = 100.0) -> EdfCheck:
    """Layer 0's aggregate at the root, FIFO and EDF, in the DES and in the single-link model."""
    fifo, sc = _first_layer_at_child("fifo", total_bytes=total_bytes, mbit=mbit)
    edf, _ = _first_layer_at_child("edf", total_bytes=total_bytes, mbit=mbit)
    sizes = [_wire_bytes(sc, layer) for layer in range(len(sc.payload.layer_sizes()))]
    rate = mbit * 1e6 / 8
    chunk = sc.gateway.edf.chunk_bytes
    model = [
        run_pipeline(
            cls(chunk_bytes=chunk, coalesce_bytes=0),
            sizes,
            rate_bytes_s=rate,
            backward_s=sc.compute.mean_s,
            forward_s=0.0,
        ).arrival_s[0]
        for cls in (FifoQueue, EdfQueue)
    ]
    return EdfCheck(fifo, edf, model[0], model[1])


def _wire_bytes(sc: Scenario, layer: int) -> int:
    """Payload bytes of site b's push of ``layer`` as the codec puts them on the wire (its index
    encoding is chosen per payload: a full-density layer needs next to no index bytes)."""
    p = make_payload(
        sc.seed, 1, 0, layer, dense_len=sc.payload.layer_sizes()[layer], density=sc.payload.density
    )
    return sum(len(b) for b in encode_payload(p)[1])


@dataclass(frozen=True)
class StragglerCheck:
    des_base_s: float
    des_ours_s: float
    fluid_change: float
    comm_fraction: float
    reallocations: int

    @property
    def des_change(self) -> float:
        return self.des_ours_s / self.des_base_s - 1


def packaged(name: str) -> Path:
    return Path(str(resources.files("sims") / "scenarios" / f"{name}.toml"))


def straggler_check(*, iterations: int | None = None, skip: int = 10) -> StragglerCheck:
    """Mean iteration time with and without rate reallocation (first ``skip`` iterations left out), and
    the fluid model's change for the DES's own compute/communication split."""
    sc = load_scenario(packaged("straggler-seed002"))
    if iterations is not None:
        sc = sc.replace(iterations=iterations)
    sc = sc.replace(sample_interval_s=0.0)
    off = sc.replace(gateway=dataclasses.replace(sc.gateway, rates=RateConfig(enabled=False)))
    sim_on = Simulation(sc)
    on = sim_on.run()
    base = Simulation(off).run()
    t_on = statistics.fmean(on.iteration_times()[skip:])
    t_off = statistics.fmean(base.iteration_times()[skip:])
    # the fluid model's split: compute / (compute + the uniform link's time), from the baseline run
    compute = sc.compute.mean_s
    uniform_comm = max(0.0, (t_off - compute) / sc.profile.slowdown)
    frac = uniform_comm / (compute + uniform_comm) if uniform_comm > 0 else 0.7
    fluid_on = simulate(
        "straggler", cfg=sc.gateway.rates, iterations=sc.iterations, compute_s=1 - frac, comm_s=frac
    )
    fluid_off = simulate("straggler", cfg=None, iterations=sc.iterations, compute_s=1 - frac, comm_s=frac)
    fluid_change = fluid_on.mean_iteration_s / fluid_off.mean_iteration_s - 1
    return StragglerCheck(t_off, t_on, fluid_change, frac, sim_on.nodes["a"].allocator.reallocations)
