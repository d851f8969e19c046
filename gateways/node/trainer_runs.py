"""Which trainer run a gateway serves, and what it does while that run's trainer is gone. Sans-IO.

A trainer process is one *run* (a random id its ``wanrt.init`` makes, in the Hello). Three things can
happen to the run this gateway serves, and each asks for a different answer to the next run that knocks:

* **it is connected** — a second launch is another job's run by mistake (or a torchrun restart that came
  before the old connection's end reached us): refused, with ``retry`` so a restart tries again shortly;
* **it finished** (its ``close()`` said Bye) — a new run against these gateways would be taken for the old
  one's re-sends and hang: refused at ``wanrt.init`` with one clear message, unless it resumes from a
  checkpoint of exactly the iteration where this site stopped (``resume_at``, docs/client.md);
* **it died** (the connection ended without Bye, or went silent) — the next run is its restart
  (torchrun's, or the same command again): let in at the first iteration not yet pushed for this site
  (the Welcome's ``restart_from``), and it fetches the job's parameters and optimizer state from a running
  site by the checksum-verified parameter resync (gateways.node.resync). torchft and PCCL recover a lost
  replica from a healthy peer the same way.

While the site's trainer is dead the job must not wait for it: after ``grace_s`` (a reconnect of the same
run would come back sooner) the gateway pushes an *empty* contribution for this site for every layer up
to two iterations past the newest result delivered here — the very push a trainer makes while its resync
is pending (docs/resync_discard.md) — so every round completes at every site, the site's data is simply
left out, and the parameters of all sites stay identical. It never pushes the iteration a replacement has been
offered (``restart_from``), so the replacement's first push is the site's next one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["RunVerdict", "TrainerRuns", "resume_at_of"]

#: iterations per layer the gateway fills with empty pushes in one call (bounds one call's work; the
#: frontier moves at most ``window`` past the site's last push, so one call normally fills 1-2)
MAX_FILL_PER_CALL = 64

#: how far past the newest delivered result the empty pushes go: the round the other sites' trainers wait
#: for under staleness 1 (each later result moves it on, so a larger staleness only goes one round per
#: result instead of several)
AHEAD = 2

RunState = Literal["none", "connected", "finished", "gone"]


@dataclass(frozen=True, slots=True)
class RunVerdict:
    """What to do with a trainer of run ``run``: ``problem`` (refuse, and why; ``retry``: it may work in a
    few seconds) or let it in as ``kind``: ``same`` (a reconnect), ``first`` (this gateway's first run),
    ``replace`` (the restart of a dead run), ``resume`` (a checkpoint at the iteration this site stopped)."""

    kind: str
    problem: str | None = None
    retry: bool = False


def resume_at_of(info: Mapping[str, Any]) -> int | None:
    """The Hello's ``resume_at`` (the iteration of the checkpoint the trainer resumes from), if valid."""
    v = info.get("resume_at")
    return v if type(v) is int and 0 <= v < 1 << 62 else None


class TrainerRuns:
    """The run served, its state, and the empty pushes made for it while it is gone."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.run: str | None = None
        self.state: RunState = "none"
        self.gone_since: float | None = None
        self.gone_reason = ""
        #: the iteration offered to a replacement (Welcome ``restart_from``): empty pushes stay below it
        self.offered: int | None = None
        self.stopped_at: int | None = None  # where the finished run stopped (its next push)
        self.empty_pushes = 0  # pushes made for a dead trainer (status)
        self.replaced = 0  # dead runs' restarts let in
        self.resumed = 0  # runs resumed from a checkpoint
        self._told = False  # the proxy start was logged

    # -- the verdict ------------------------------------------------------------------------------------

    def verdict(
        self,
        run: Any,
        resume_at: int | None,
        next_push: int | None,
        frontier: int,
        *,
        served: bool = True,
        resync_pending: bool = False,
        reconnect: bool = False,
    ) -> RunVerdict:
        """Pure: what a trainer of ``run`` gets (no state changes; :meth:`admit` makes them).
        ``next_push``: this site's next iteration (None: the gateway has not joined the job yet);
        ``served``: this gateway counted a push of some run (before that, a new run simply takes over);
        ``reconnect``: the trainer's link comes back (after this gateway restarted, say), not a new one."""
        if not isinstance(run, str) or not run:
            return RunVerdict("same")  # a client that does not say its run: nothing to compare
        if next_push is None:
            if resume_at is not None:
                return RunVerdict("first", "this gateway has not joined the job yet", retry=True)
            next_push = 0
        fresh_start = self.run is None and not served and resume_at is None and not reconnect
        if fresh_start and next_push > 0 and not resync_pending:
            return RunVerdict(
                "first",
                f"these gateways resume the job at iteration {next_push} (their state files), and no site "
                "has its parameters: resume the trainers from their checkpoint (wanrt.init(..., "
                "resume_at=N) with the gateways started with --resume-at N), or start the job anew "
                "(stop the gateways, delete their state files)",
            )
        if not served and self.state != "connected" and resume_at is None:
            return RunVerdict("first")
        if self.run is None or run == self.run:
            if resume_at is not None and self.run is None and resume_at != next_push:
                return RunVerdict(
                    "first",
                    f"this trainer resumes from a checkpoint of iteration {resume_at}, but this gateway "
                    f"runs the job from iteration {next_push}; start every gateway with resume_at = "
                    f"{resume_at} (`wanrt gateway --config ... --resume-at {resume_at}`, docs/client.md)",
                )
            return RunVerdict("same" if self.run is not None else "first")
        if self.state == "gone" and resume_at is None:
            return RunVerdict("replace")
        if self.state == "finished" and resume_at is not None and resume_at == self.stopped_at:
            return RunVerdict("resume")
        old = self.run
        if self.state == "connected":
            return RunVerdict(
                "refused",
                f"this gateway's trainer of run {old} is connected and training (job at iteration "
                f"{frontier}): is this site's trainer already running? A second run of the job needs its "
                "own gateways (another job name)",
                retry=True,
            )
        if self.state == "gone":  # resume_at given
            return RunVerdict(
                "refused",
                f"this site's trainer of run {old} died while the job runs (at iteration {frontier}): start "
                "it again without resume_at; it rejoins at the job's iteration and fetches the job's "
                "parameters and optimizer state from another site",
            )
        if self.state == "finished" and resume_at is not None:
            return RunVerdict(
                "refused",
                f"this trainer resumes from a checkpoint of iteration {resume_at}, but run {old} of this "
                f"job stopped at iteration {self.stopped_at} here: resume every site from the checkpoint "
                "of the same iteration",
            )
        return RunVerdict(
            "refused",
            f"this gateway already served another training run (run {old}), which finished here at "
            f"iteration {self.stopped_at} (its trainer closed): a new run needs fresh gateways (restart "
            "`wanrt gateway` at every site, deleting their state files) or another job name; to continue "
            "that run, resume from its checkpoint (wanrt.init(..., resume_at=N), docs/client.md)",
        )

    def admit(self, run: Any, verdict: RunVerdict) -> None:
        if isinstance(run, str) and run:
            self.run = run
        if verdict.kind == "replace":
            self.replaced += 1
        elif verdict.kind == "resume":
            self.resumed += 1

    # -- the trainer comes and goes ----------------------------------------------------------------------

    def connected(self) -> None:
        self.state = "connected"
        self.gone_since = None
        self.offered = None
        self._told = False

    def left(self, *, clean: bool, reason: str, next_push: int, now: float) -> None:
        if clean:
            self.state = "finished"
            self.stopped_at = next_push
            self.gone_since = None
        else:
            self.state = "gone"
            self.gone_since = now
            self.gone_reason = reason

    def due(self) -> float | None:
        """When the empty pushes start (None: not waiting for that)."""
        if self.state != "gone" or self.gone_since is None or self._told:
            return None
        return self.gone_since + self.grace_s

    def proxying(self, now: float) -> bool:
        return self.state == "gone" and self.gone_since is not None and now >= self.gone_since + self.grace_s

    @property
    def empties_started(self) -> bool:
        """The empty pushes for the dead trainer began (before that, results are kept for a reconnect)."""
        return self.state == "gone" and self._told

    def start_told(self) -> bool:
        """True once per absence: the caller logs and tells the other sites that the proxy started."""
        if self._told:
            return False
        self._told = True
        return True

    def fill(
        self, now: float, delivered: int, layers: Mapping[int, tuple[int, tuple[int, int] | None]]
    ) -> list[tuple[int, int, tuple[int, int]]]:
        """(iteration, layer, (dense_len, block_size)) of the empty pushes due now for a dead trainer:
        every layer up to ``delivered + AHEAD`` (``delivered``: the newest round result here; under
        staleness 1 the other sites' trainers wait for at most that round), below an offered restart.
        Each result delivered moves it on by one, so the rounds go on in step with the other sites."""
        if not self.proxying(now):
            return []
        high = delivered + AHEAD
        if self.offered is not None:
            high = min(high, self.offered - 1)
        out = []
        for layer, (last, shape) in sorted(layers.items()):
            if shape is None:
                continue
            for it in range(last + 1, min(high, last + MAX_FILL_PER_CALL) + 1):
                out.append((it, layer, shape))
        self.empty_pushes += len(out)
        return out

    def status(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "state": self.state,
            "gone_reason": self.gone_reason if self.state == "gone" else "",
            "empty_pushes": self.empty_pushes,
            "replaced": self.replaced,
            "resumed": self.resumed,
            "stopped_at": self.stopped_at,
        }
