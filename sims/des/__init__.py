"""Discrete-event simulation of whole gateway nodes on virtual time (docs/sim.md).

:class:`~sims.des.world.Simulation` drives real :class:`~gateways.node.GatewayNode` objects — the very
objects the daemons run — over modelled WAN links (:mod:`sims.des.link`), with trainer stand-ins
(:mod:`sims.des.trainer`) and compute-time models (:mod:`sims.des.compute`), from a scenario file
(:mod:`sims.des.scenario`). Nothing here imports asyncio, sockets, threads or clocks: a guard test checks.
"""

from sims.des.loop import EventLoop
from sims.des.scenario import Scenario, load_scenario
from sims.des.world import SimResult, Simulation, run_scenario

__all__ = ["EventLoop", "Scenario", "SimResult", "Simulation", "load_scenario", "run_scenario"]
