"""AntDT-ND's KILL_RESTART of persistent straggler *ranks*, for the scheduler daemon's straggler policy.

The site policy (:mod:`scheduler.stragglers.daemon_policy`) sees each site as one member; inside a site,
one slow rank holds back every rank of it at each collective, and AntDT's answer to a rank that stays slow
(§VI-A4: long-window BPT ≥ λ × the mean, a *persistent* straggler, e.g. a bad node) is to kill it and start
it again elsewhere (§V-E3, a node action: no coordination with the other nodes needed). Here:

* **Monitor** (§VI-A2): each site leader reports every rank's batch processing time of its last iteration
  (``trainer.rank.<r>.compute_s``, :mod:`wanrt.rank_telemetry`); one sample per new iteration goes into the
  windows of member ``<site>/<r>`` of two :class:`~scheduler.stragglers.detection.StragglerDetector` s:
  one per site (its ranks) and one over every rank of the job.
* **Detection**: a rank is compared with its site's ranks; at a site of one rank there is nothing to
  compare within, so it is compared with every rank of the job (the brief's rule: a bad node that is a
  site's only rank is still a node to replace).
* **Controller**: one persistent straggler rank per site (the slowest) gets a :class:`KillRestart`, unless
  it was restarted less than ``restart_cooldown_s`` ago or already ``max_restarts`` times; then the site's
  windows are forgotten (under torchrun the whole worker group restarts: every rank is a new process).
  A rank out of restarts is left to ADJUST_BS (:meth:`RankRestarts.exhausted`).
* **The old process's last samples**: between the order and its effective iteration E the old process
  still trains (slowly), and its reports keep coming until it leaves. They are not the new process's: the
  site's samples are ignored from the order until the first report of an iteration ≥ E (E is known once the
  decision is committed, :meth:`RankRestarts.committed`); the windows start again there. An order never
  committed (the node gave it up) stops holding the site back after ``long_s``.

Sans-IO: ``now`` is an argument.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Mapping

from scheduler.stragglers.decisions import KillRestart
from scheduler.stragglers.detection import DetectionReport, StragglerDetector
from scheduler.stragglers.site_config import SiteStragglerConfig
from wanrt.rank_telemetry import parse_rank_times

__all__ = ["RankRestarts", "member_name"]

log = logging.getLogger("scheduler.stragglers")

#: KILL_RESTART decisions kept for ``/status`` and tests (the decisions file keeps every one).
MAX_HISTORY = 64


def member_name(site: str, rank: int) -> str:
    return f"{site}/{rank}"


class RankRestarts:
    """See the module docstring."""

    def __init__(self, sites: Iterable[str], cfg: SiteStragglerConfig) -> None:
        self.cfg = cfg
        self.sites = tuple(sorted(sites))
        self.job = StragglerDetector([], cfg.detection, scope="rank")
        self.by_site = {s: StragglerDetector([], cfg.detection, scope="rank") for s in self.sites}
        self.world: dict[str, int] = {}
        self.restarts: dict[str, int] = {}  # member -> restarts ordered
        self._last: dict[str, float] = {}  # member -> when its last restart was ordered
        self.history: deque[KillRestart] = deque(maxlen=MAX_HISTORY)
        #: site -> (when ordered, effective iteration once committed): its samples wait for the new process
        self.restarting: dict[str, tuple[float, int | None]] = {}

    def waiting(self, site: str, iteration: int, now: float) -> bool:
        """Whether ``site``'s report of ``iteration`` still comes from a process ordered restarted (then
        it is no sample of anything: the policy skips it for the site's windows too)."""
        pending = self.restarting.get(site)
        if pending is None:
            return False
        since, effective = pending
        if effective is None:
            if now - since < self.cfg.detection.long_s:
                return True
            del self.restarting[site]  # never committed: the order is void
            return False
        if iteration < effective:
            return True
        del self.restarting[site]  # the new process's first report: fresh windows from here
        self._forget_site(site)
        return False

    def committed(self, site: str, effective_iteration: int) -> None:
        """The order for ``site`` runs at ``effective_iteration`` (the node committed it)."""
        pending = self.restarting.get(site)
        if pending is not None:
            self.restarting[site] = (pending[0], effective_iteration)

    def observe(
        self,
        site: str,
        metrics: Mapping[str, float],
        now: float,
        world: int,
        batch: int,
        local_steps: int = 1,
    ) -> None:
        """One new iteration of ``site`` (the caller skips repeats and :meth:`waiting` ones): its ranks'
        times into the windows. A gateway that forwards malformed rank keys gets RemoteProtocolError (it
        checked them itself). ``local_steps``: a WAN iteration of k micro-steps (ElasticBSP §4) is judged
        per micro-step (its time / k), so sites running different k compare alike."""
        if site not in self.by_site:
            return
        times = parse_rank_times(metrics, prefix="trainer.", world_size=world, peer=site)
        self.world[site] = world
        for rank, t in times.items():
            if t <= 0:
                continue  # an iteration without compute (a clock that did not move): no information
            m = member_name(site, rank)
            for det in (self.job, self.by_site[site]):
                if m not in det.members:
                    det.add_member(m)
                det.observe(m, now, t / local_steps, batch)

    def _report(self, site: str, reports: dict[str, DetectionReport], now: float) -> DetectionReport:
        key = site if self.world.get(site, 1) >= 2 else ""
        if key not in reports:
            reports[key] = (self.by_site[site] if key else self.job).report(now)
        return reports[key]

    def _persistent(self, site: str, report: DetectionReport) -> list[str]:
        """Persistent stragglers of ``site`` that are slow *now* too: short-window ratio ≥ λ as well (ours:
        a rank whose recent iterations are normal recovered, and one with no recent iteration — a site that
        stopped training — is not judged on what its windows still hold)."""
        head = site + "/"
        lam = self.cfg.detection.slowness
        return [
            m
            for m in report.persistent
            if m.startswith(head) and (report.members[m].short_ratio or 0.0) >= lam
        ]

    def decide(self, now: float) -> list[KillRestart]:
        """KillRestart for the slowest persistent straggler rank of each site that may be restarted."""
        if not self.cfg.kill_restart:
            return []
        out: list[KillRestart] = []
        reports: dict[str, DetectionReport] = {}
        for site in self.sites:
            report = self._report(site, reports, now)
            ready = [m for m in self._persistent(site, report) if self._may_restart(m, now)]
            if not ready:
                continue
            m = max(ready, key=lambda x: (report.members[x].long_ratio or 0.0, x))
            st = report.members[m]
            ratio = st.long_ratio or 0.0
            among = "its site's ranks" if self.world.get(site, 1) >= 2 else "every rank of the job"
            n = self.restarts.get(m, 0) + 1
            why = (
                f"persistent straggler rank: long-window time per sample {ratio:.2f}× the mean of {among} "
                f"(short window {st.short_ratio or 0.0:.2f}×; restart {n} of at most {self.cfg.max_restarts})"
            )
            d = KillRestart(now, m, "rank", why)
            out.append(d)
            self.history.append(d)
            self.restarts[m] = n
            self._last[m] = now
            self._forget_site(site)
            self.restarting[site] = (now, None)
            log.warning("KILL_RESTART %s: %s", m, why)
        return out

    def _may_restart(self, member: str, now: float) -> bool:
        if self.restarts.get(member, 0) >= self.cfg.max_restarts:
            return False
        since = self._last.get(member)
        return since is None or now - since >= self.cfg.restart_cooldown_s

    def _forget_site(self, site: str) -> None:
        """The site's worker group restarts as a whole: every rank's windows start again."""
        head = site + "/"
        for det in (self.job, self.by_site[site]):
            for m in det.members:
                if m.startswith(head):
                    det.forget(m)

    def awaits_restart(self, site: str, now: float) -> bool:
        """Whether ``site`` has a persistent straggler rank that may still be restarted: its batch split
        waits for the fresh process (one detection report, not one per question)."""
        persistent = self._persistent(site, self._report(site, {}, now))
        return bool(persistent) and not any(
            self.restarts.get(m, 0) >= self.cfg.max_restarts for m in persistent
        )
