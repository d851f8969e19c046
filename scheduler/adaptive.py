"""StellaTrain's controller (:class:`~scheduler.control.policy.SchedulerPolicy`) behind the scheduler node's
:class:`~scheduler.node.DecisionPolicy` interface: gateway reports in, trainer settings out.

The controller reasons about "ranks" with a throughput model each (Eq. 2). Here a rank is a *site*: its
leader reports the site's compute and iteration time and its per-rank batch size × world size is the
site's batch x_i, so Eq. 6's slowest-site balance is what the search equalises. A decision's per-site batch
sizes travel as :attr:`~wanrt.protocol.job_settings.JobSettings.site_batch_size` (per rank at that site);
each gateway hands its own to its trainers as ``batch_size``. The WAN goodput cross-check is the mean over
sites of each gateway's bytes sent per second.
Each gateway's per-peer ``link.<peer>.busy_bytes`` and ``link.<peer>.busy_s`` feed the controller's link
rates as link ``<site>><peer>`` (:mod:`scheduler.control.link_rate`).

Sans-IO: time comes in as an argument; nothing here reads a clock.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterator, Mapping, Sequence

from scheduler.control.config import SchedulerConfig
from scheduler.control.convergence import ConvergenceModel
from scheduler.control.decision import Decision
from scheduler.control.policy import SchedulerPolicy
from wanrt.protocol.job_settings import JobSettings

__all__ = ["AdaptivePolicy"]

log = logging.getLogger("scheduler.adaptive")


def _link_counters(metrics: Mapping[str, float], kind: str) -> Iterator[tuple[str, float, float]]:
    """(peer, bytes, seconds) of every ``link.<peer>.<kind>_bytes|<kind>_s`` pair in a gateway report whose
    two values are finite and ≥ 0: a malformed pair is skipped, the others still count."""
    for key, secs in metrics.items():
        if not (key.startswith("link.") and key.endswith(f".{kind}_s")):
            continue
        peer = key[len("link.") : -len(f".{kind}_s")]
        nbytes = metrics.get(f"link.{peer}.{kind}_bytes")
        if nbytes is None or not (math.isfinite(nbytes) and math.isfinite(secs)) or nbytes < 0 or secs < 0:
            continue
        yield peer, nbytes, secs


#: the goodput is bytes sent over at least this much wall time: ``bytes_sent`` counts bytes when handed
#: to the link, which takes a burst into its queue at once; over one 0.25 s report interval it read up to
#: 290 Mbit/s on a 100 Mbit/s link, and the estimator's goodput floor lifted the estimate to 234 Mbit/s
GOODPUT_WINDOW_S = 2.0


class AdaptivePolicy:
    """See the module docstring."""

    def __init__(self, sites: Sequence[str], config: SchedulerConfig, convergence: ConvergenceModel) -> None:
        self.sites = tuple(sorted(sites))
        self.cfg = config
        self.convergence = convergence
        self.policy: SchedulerPolicy | None = None  # built once the model's size is known
        self._world: dict[str, int] = {}
        self._bytes: dict[str, tuple[float, float]] = {}  # site -> (bytes sent, at)
        self._goodput: dict[str, float] = {}
        self._pending: Decision | None = None
        self._running = JobSettings()

    def _rank(self, site: str) -> int:
        return self.sites.index(site)

    def observe(self, site: str, metrics: Mapping[str, float], now: float) -> None:
        if site not in self.sites:
            return
        if self.policy is None:
            params = metrics.get("trainer.params")
            if params is None or params < 1:
                return  # no trainer report yet: nothing to plan with
            # what the trainers run: a committed decision's values, else what the leader reports running
            density = metrics.get("cfg.density", metrics.get("trainer.density"))
            staleness = metrics.get("cfg.staleness", metrics.get("trainer.staleness", 1))
            ok = density is not None and math.isfinite(density) and 0 < density <= 1
            self.policy = SchedulerPolicy(
                self.cfg,
                self.convergence,
                n_params=int(params),
                ranks=range(len(self.sites)),
                initial_density=float(density) if ok and density is not None else None,
                initial_staleness=int(staleness) if math.isfinite(staleness) else 1,
            )
        self._observe_goodput(site, metrics, now)
        self._observe_links(site, metrics, now)
        world = int(metrics.get("trainer.world_size", 1))
        self._world[site] = max(1, world)
        it = metrics.get("trainer.iteration")
        batch = metrics.get("trainer.batch_size")
        compute = metrics.get("trainer.compute_s")
        wall = metrics.get("trainer.iteration_s")
        if it is None or batch is None or compute is None or wall is None:
            return
        if not all(math.isfinite(v) for v in (it, batch, compute, wall)) or compute <= 0 or wall <= 0:
            return
        # the trainer's time after backward that is not waiting: the compression tail and the sparse
        # update's application, the payload's CPU cost (scheduler/control/byte_cost.py)
        fwd, bwd = metrics.get("trainer.forward_s"), metrics.get("trainer.backward_s")
        # an outer loop's round (DiLoCo: H inner optimizer steps per WAN iteration, step_timing.py) covers
        # H batches, and its forward/backward marks span the round, not one step
        h = metrics.get("trainer.inner_steps", 1.0)
        inner = int(h) if math.isfinite(h) and h >= 1 else 1
        byte_s = None
        if inner == 1 and fwd is not None and bwd is not None and math.isfinite(fwd) and math.isfinite(bwd):
            byte_s = max(0.0, float(compute) - max(0.0, fwd) - max(0.0, bwd))
        # local micro-steps (ElasticBSP §4): the WAN iteration's compute covers k batches, so its samples
        # are k × batch (the throughput stays right; this policy's batch plan assumes k = 1 everywhere);
        # likewise the H inner steps of an outer round
        k = metrics.get("trainer.local_steps", 1.0)
        steps = (int(k) if math.isfinite(k) and k >= 1 else 1) * inner
        self.policy.observe_rank(
            self._rank(site),
            iteration=int(it),
            batch_size=int(batch) * self._world[site] * steps,
            compute_s=float(compute),
            iteration_s=float(wall),
            now=now,
            byte_s=byte_s,
        )

    def _observe_links(self, site: str, metrics: Mapping[str, float], now: float) -> None:
        if self.policy is None:
            return
        for key, busy in metrics.items():
            if not (key.startswith("link.") and key.endswith(".busy_s")):
                continue
            peer = key[len("link.") : -len(".busy_s")]
            sent = metrics.get(f"link.{peer}.busy_bytes")
            if sent is None or not (math.isfinite(sent) and math.isfinite(busy)) or sent < 0 or busy < 0:
                continue
            peak = metrics.get(f"link.{peer}.peak_bps")
            if peak is not None and not (math.isfinite(peak) and peak >= 0):
                peak = None
            rate = self.policy.observe_link(
                f"{site}>{peer}", bytes_sent=sent, busy_s=busy, now=now, peak_bps=peak
            )
            if rate is not None:
                log.debug("link %s>%s: %.1f Mbit/s while sending", site, peer, rate / 1e6)
        for peer, nbytes, secs in _link_counters(metrics, "backlog"):
            rate = self.policy.observe_link_backlog(f"{site}>{peer}", nbytes=nbytes, seconds=secs, now=now)
            if rate is not None:
                log.debug("link %s>%s: %.1f Mbit/s while backlogged", site, peer, rate / 1e6)
        for key, pace in metrics.items():
            # the sender's pacing rate per link: a delivery rate near it measured wanrt's pacer
            if key.startswith("link.") and key.endswith(".rate_bps") and math.isfinite(pace) and pace > 0:
                self.policy.links.observe_pacing(f"{site}>{key[len('link.') : -len('.rate_bps')]}", pace, now)
        for peer, nbytes, secs in _link_counters(metrics, "rx"):
            # the receiver ``site`` reports the peer → site direction: the same link as the peer's own
            # ``link.<site>.backlog_*`` (named sender>receiver, so the two replace each other per direction)
            counts = [metrics.get(f"link.{peer}.rx_{c}") for c in ("n", "fast")]
            n, fast = (v if v is not None and math.isfinite(v) and v >= 0 else None for v in counts)
            rate = self.policy.observe_link_rx(
                f"{peer}>{site}", nbytes=nbytes, seconds=secs, now=now, n=n, fast=fast
            )
            if rate is not None:
                log.debug("link %s>%s: %.1f Mbit/s from the receiver's tails", peer, site, rate / 1e6)
        for peer, nbytes, secs in _link_counters(metrics, "probe"):  # timed probe trains, the same direction
            rate = self.policy.observe_link_probe(f"{peer}>{site}", nbytes=nbytes, seconds=secs, now=now)
            if rate is not None:
                log.debug("link %s>%s: %.1f Mbit/s from a probe train", peer, site, rate / 1e6)

    def _observe_goodput(self, site: str, metrics: Mapping[str, float], now: float) -> None:
        sent = sum(v for k, v in metrics.items() if k.startswith("link.") and k.endswith(".bytes_sent"))
        prev = self._bytes.get(site)
        if prev is None or sent < prev[0] or now < prev[1]:
            self._bytes[site] = (sent, now)
            return
        if now - prev[1] < GOODPUT_WINDOW_S:
            return
        self._bytes[site] = (sent, now)
        if sent == prev[0]:
            # an idle window (the job is paused, or not started) measures no goodput: observing 0 made the
            # estimator refuse it and abort this gateway's link every window (issue 21: the idle scheduler
            # link flapped every ~5 s with "goodput must be finite and > 0 (value=0.0)")
            self._goodput.pop(site, None)
            return
        self._goodput[site] = (sent - prev[0]) * 8.0 / (now - prev[1])
        if self.policy is not None and len(self._goodput) == len(self.sites):
            self.policy.observe_goodput(sum(self._goodput.values()) / len(self._goodput), now)

    def decide(self, now: float) -> JobSettings | None:
        if self.policy is None:
            return None
        d = self.policy.decide(now)
        if d is None:
            return None
        self._pending = d
        per_rank = {}
        for rank, site_batch in zip(d.ranks, d.batch_sizes, strict=True):
            site = self.sites[rank]
            per_rank[site] = max(1, round(site_batch / self._world.get(site, 1)))
        samples = {s: b * self._world.get(s, 1) for s, b in per_rank.items()}
        total = sum(samples.values())
        values = JobSettings(
            density=float(d.density),
            staleness=int(d.staleness),
            site_batch_size=per_rank,
            # so the sum across sites averages samples, not sites
            site_batch_weight={site: n * len(samples) / total for site, n in samples.items()},
        )
        log.info("decision (%s): %s at %.3g Mbit/s", d.reason, values.to_wire(), d.bandwidth_bps / 1e6)
        return values

    def committed(self, values: JobSettings, effective_iteration: int) -> None:
        """The decision carrying ``values`` takes effect at ``effective_iteration`` everywhere."""
        self._running = values
        d = self._pending
        if self.policy is None or d is None:
            return
        if values.density == float(d.density) and values.staleness == int(d.staleness):
            self.policy.confirm(dataclasses.replace(d, effective_iteration=effective_iteration))
            self._pending = None
