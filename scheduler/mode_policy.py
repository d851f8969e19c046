"""The mode choice behind the scheduler node's :class:`~scheduler.node.DecisionPolicy` interface: the
adaptive policy decides density, batch and staleness as before, and this adds the exchange mode it chose
(``outer_steps``, ``fragments``, ``outer_coding``; :mod:`scheduler.control.mode_choice`) to the same
announcements, so a mode switch takes effect at one job-wide iteration like every other decision.

Inputs, from the gateways' reports: the adaptive policy's bandwidth estimate (Eq. 6's B) and exchange
latency, each site's compute per inner step (``trainer.micro_step_s``, else ``trainer.compute_s`` over
``trainer.local_steps`` × the ``outer_steps`` in force; the slowest site paces a synchronous job), the
model's size and the density and staleness in force.

While an outer mode is in force the pseudo-gradient's density is the live ``density`` (wanrt.DiLoCo
compresses with the client's config), so this pins ``density`` to the plan's coding's ``outer_density``
over whatever the adaptive policy decides for per-step exchange; and ``wanrt.DiLoCo`` codes values in the
wire dtype the trainers connected with, so ``[scheduler.mode] codings`` should list that one coding (a
live switch of the wire coding does not exist; ``outer_coding`` is announced for an outer loop that reads
it), the model's size and the density and
staleness in force. ``[scheduler.mode] enabled = true`` with ``policy = "adaptive"`` turns it on
(scheduler/service/policies.py). Sans-IO: time comes in as an argument.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from scheduler.adaptive import AdaptivePolicy
from scheduler.control.mode_choice import ModeChooser, ModePlan
from scheduler.control.mode_config import ModeConfig
from scheduler.control.mode_cost import LinkState
from wanrt.protocol.job_settings import JobSettings

__all__ = ["ModePolicy", "mode_settings"]

log = logging.getLogger("scheduler.mode")


def mode_settings(plan: ModePlan) -> JobSettings:
    """The settings that put ``plan`` in force (per-step: H = 1, F = 1, the trainers' own coding)."""
    if plan.mode == "per_step":
        return JobSettings(outer_steps=1, fragments=1)
    return JobSettings(outer_steps=plan.outer_steps, fragments=plan.fragments, outer_coding=plan.coding)


def _finite(metrics: Mapping[str, float], key: str) -> float | None:
    v = metrics.get(key)
    return float(v) if v is not None and math.isfinite(v) else None


def _batches_held(values: JobSettings) -> JobSettings:
    """``values`` without the adaptive policy's batch decisions (batch sizes, their weights, the learning
    rate scale that follows them).

    Why: the StellaTrain search (Eq. 1) models per-step exchange, where a site's batch only sets its pace.
    Under an outer loop a site's batch is its inner optimizer's own hyperparameter for H local steps:
    moving it changes the optimisation, not just the pace. Measured (tools/bench_outer.py, session 12):
    the auto arm, staying at the fixed arm's H 16, took 21 outer steps to the target against the fixed
    arm's 15 at 100 Mbit/s in three runs, its batches moved as far as a 2 / b 48 / c 46 for a round."""
    return dataclasses.replace(
        values,
        batch_size=None,
        batch_weight=None,
        lr_scale=None,
        site_batch_size={},
        site_batch_weight={},
    )


class ModePolicy:
    """See the module docstring."""

    def __init__(self, sites: Sequence[str], inner: AdaptivePolicy, config: ModeConfig) -> None:
        self.sites = tuple(sorted(sites))
        self.inner = inner
        self.cfg = config
        self.chooser = ModeChooser(config)
        self._step_s: dict[str, float] = {}
        self._params: int | None = None
        self._density: float | None = None
        self._staleness = 1
        self._announced: ModePlan | None = None

    # the daemon reads the StellaTrain controller as ``policy.policy`` (its estimate, last decision)
    @property
    def policy(self) -> Any:
        return self.inner.policy

    @property
    def last_mode_plan(self) -> ModePlan | None:
        """The plan in force, else the one announced (for /status and the decisions file)."""
        return self.chooser.current or self.chooser.pending

    def observe(self, site: str, metrics: Mapping[str, float], now: float) -> None:
        self.inner.observe(site, metrics, now)
        if site not in self.sites:
            return
        params = _finite(metrics, "trainer.params")
        if params is not None and params >= 1:
            self._params = int(params)
        density = _finite(metrics, "cfg.density") or _finite(metrics, "trainer.density")
        if density is not None and 0 < density <= 1:
            self._density = density
        staleness = _finite(metrics, "cfg.staleness")
        if staleness is not None:
            self._staleness = int(staleness)
        # one inner step: the trainer's micro_step_s is that already (wanrt.DiLoCo divides its round's
        # compute by local_steps·H); from a WAN iteration's compute divide by both (the gateway reports the
        # H in force: with an outer loop a WAN iteration is one outer step of H inner steps)
        step = _finite(metrics, "trainer.micro_step_s")
        if step is None:
            compute, k = _finite(metrics, "trainer.compute_s"), _finite(metrics, "trainer.local_steps")
            outer = _finite(metrics, "cfg.outer_steps")
            per = (k if k is not None and k >= 1 else 1.0) * (
                outer if outer is not None and outer >= 1 else 1.0
            )
            step = None if compute is None else compute / per
        if step is not None and step > 0:
            self._step_s[site] = step

    def _state(self) -> LinkState | None:
        controller = self.inner.policy
        if controller is None or self._params is None or len(self._step_s) < len(self.sites):
            return None
        bandwidth = float(controller.bandwidth_estimate_bps)
        latency = float(getattr(getattr(controller, "latency", None), "latency_s", 0.0) or 0.0)
        if not (math.isfinite(bandwidth) and bandwidth > 0):
            return None
        return LinkState(
            bandwidth_bps=bandwidth,
            compute_s=max(self._step_s.values()),
            n_params=self._params,
            sites=len(self.sites),
            latency_s=latency if math.isfinite(latency) and latency >= 0 else 0.0,
            per_step_density=self._density or 0.02,
            staleness=self._staleness,
        )

    def decide(self, now: float) -> JobSettings | None:
        values = self.inner.decide(now)
        state = self._state()
        plan = None if state is None else self.chooser.plan(state, now)
        outer = plan or self.last_mode_plan
        if values is not None and outer is not None and outer.mode != "per_step":
            values = _batches_held(values)
        if plan is not None:
            self._announced = plan
            log.info("mode %s", plan.why)
            values = (values or JobSettings()).overlay(self._settings_of(plan))
        elif values is not None and (running := self.last_mode_plan) is not None:
            values = values.overlay(self._settings_of(running))  # the adaptive density is per-step's
        return values

    def _settings_of(self, plan: ModePlan) -> JobSettings:
        mode = mode_settings(plan)
        if plan.mode == "per_step":
            return mode
        return mode.overlay(JobSettings(density=self.cfg.outer_density[plan.coding]))

    def committed(self, values: JobSettings, effective_iteration: int) -> None:
        self.inner.committed(values, effective_iteration)
        plan = self._announced
        if plan is None:
            return
        if values.outer_steps == mode_settings(plan).outer_steps and values.fragments == plan.fragments:
            done = self.chooser.confirm(effective_iteration)
            self._announced = None
            if done is not None:
                log.info("mode %s in force from iteration %d", done.label, effective_iteration)
