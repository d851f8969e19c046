"""Policies and toy simulations that only simulations run: the scheduler daemon drives none of them.

:class:`~sims.policies.straggler_policy.StragglerPolicy` decides for ranks and sites from whole-cluster
telemetry (AntDT's controller with STAR's mode choice) and is exercised by the BSP simulation
(:mod:`~sims.policies.bsp_sim`); :mod:`~sims.policies.elastic_sim` and :mod:`~sims.policies.toy_sim`
are the small simulations of the barrier and the adaptive controller that the benchmarks report. The
daemon's policies (``scheduler/service/policies.py``) are in ``scheduler/``; these stand beside the
simulator because that is the only place they run.
"""
