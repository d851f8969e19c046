"""A toy closed loop for the policy: ranks with Eq. 2 throughputs behind one WAN link of a given true rate.

Not the project's simulator (``sims/``), which will drive the same :class:`SchedulerPolicy` through the real
daemons' message flow; this is the smallest model in which the bandwidth feedback loop of §4.1 can be
checked, shared by the tests and ``tools/bench_scheduler.py``:

* rank ``i`` computes for ``x_i / f_i(x_i)`` seconds (Eq. 2), times ``1 + noise·N(0, 1)``;
* the exchange moves ``density · n_params · bytes_per_element`` bytes at the true rate;
* iteration time ``= max(compute, exchange)`` at staleness 1 (the exchange overlaps the next compute),
  ``compute + exchange`` at staleness 0; every rank reports ``idle = 1 − compute_i / iteration``;
* each decision is effective from the next iteration (the daemon's part, instantaneous here), or
  ``effect_delay`` iterations later (the daemon's announce margin: the plan reaches the trainers late);
* optionally (``link_telemetry``) the link reports its counters after every iteration, as the gateways'
  ``link.<peer>.bytes_sent`` / ``busy_s``: the exchange's bytes and its time, which includes
  ``latency_s`` (the acknowledgement round trip of a real link; it adds to the exchange time as well);
* optionally (``link_backlog``) the link also reports its delivery while backlogged, as the gateways'
  ``link.<peer>.backlog_bytes`` / ``backlog_s``: the toy link has no burst, so every payload queues for
  it and is delivered at the link's rate (its bytes' time, without the round trip).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from scheduler.control.decision import Decision
from scheduler.control.policy import SchedulerPolicy

__all__ = ["ToyTrace", "run_toy_loop"]


@dataclass
class ToyTrace:
    """Per decision round: true rate, the estimate after the round's decide(), and the decision in force."""

    true_bps: list[float] = field(default_factory=list)
    estimate_bps: list[float] = field(default_factory=list)
    decisions: list[Decision | None] = field(default_factory=list)

    def relative_errors(self) -> list[float]:
        return [abs(e - t) / t for e, t in zip(self.estimate_bps, self.true_bps, strict=True)]


def run_toy_loop(
    policy: SchedulerPolicy,
    gpus: Sequence[tuple[float, float]],
    true_bps: Callable[[int], float],
    *,
    rounds: int,
    iterations_per_round: int = 5,
    noise: float = 0.02,
    goodput: bool = False,
    seed: int = 0,
    start_iteration: int = 0,
    link_telemetry: bool = False,
    latency_s: float = 0.0,
    effect_delay: int = 0,
    link_backlog: bool = False,
) -> ToyTrace:
    """Run ``rounds`` decision rounds; ``gpus[i]`` is rank ``policy.ranks[i]``'s true (α, β)."""
    rng = np.random.default_rng(seed)
    cfg = policy.cfg
    alpha = np.array([a for a, _ in gpus], dtype=np.float64)
    beta = np.array([b for _, b in gpus], dtype=np.float64)
    batches = np.maximum(np.round(alpha).astype(np.int64), 1)  # the job starts at each GPU's knee
    density, staleness = 1.0 - cfg.r_max, 1
    it, now = start_iteration, 0.0
    trace = ToyTrace()
    current: Decision | None = None
    pending: list[Decision] = []
    sent_bytes = busy_s = backlog_bytes = backlog_s = 0.0
    for k in range(rounds):
        rate = float(true_bps(k))
        d = policy.decide(now)
        if d is not None:
            d = d.effective_from(it + effect_delay)
            policy.confirm(d)
            pending.append(d)
        trace.true_bps.append(rate)
        trace.estimate_bps.append(policy.bandwidth_estimate_bps)
        for _ in range(iterations_per_round):
            while (
                pending
                and pending[0].effective_iteration is not None
                and pending[0].effective_iteration <= it
            ):
                current = pending.pop(0)
                batches = np.array(current.batch_sizes, dtype=np.int64)
                density, staleness = current.density, current.staleness
            payload = density * policy.n_params * cfg.bytes_per_element
            exchange = latency_s + payload * 8.0 / rate
            t = np.maximum(alpha / beta, batches / beta) * (1.0 + noise * rng.standard_normal(len(gpus)))
            t = np.maximum(t, 1e-6)
            c = float(t.max())
            wall = max(c, exchange) if staleness >= 1 else c + exchange
            now += wall
            for i, rank in enumerate(policy.ranks):
                policy.observe_rank(
                    rank,
                    iteration=it,
                    batch_size=int(batches[i]),
                    compute_s=float(t[i]),
                    iteration_s=wall,
                    now=now,
                )
            if link_telemetry:
                sent_bytes += payload
                busy_s += exchange
                policy.observe_link("toy", bytes_sent=sent_bytes, busy_s=busy_s, now=now)
            if link_backlog and payload > 0:
                backlog_bytes += payload
                backlog_s += payload * 8.0 / rate
                policy.observe_link_backlog("toy", nbytes=backlog_bytes, seconds=backlog_s, now=now)
            it += 1
        trace.decisions.append(current)
        if goodput:
            policy.observe_goodput(rate * (1.0 - 0.02 * abs(rng.standard_normal())), now)
    return trace
