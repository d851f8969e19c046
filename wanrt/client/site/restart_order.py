"""A trainer process's place in the job's life: where it starts, and the scheduler's KILL_RESTART order
reaching its iteration on every rank of a site (AntDT §V-E3).

Either the user's hook runs on the named rank and training goes on, or (no hook) every rank closes its
context cleanly and raises :class:`~wanrt.errors.RestartRequested`: the close first, so the process leaves
nothing owed (its pushes are sent and their results received) and the gateway hands the next trainer
process the job from the next iteration on (docs/kill_restart.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from wanrt.client.config import ClientConfig
from wanrt.errors import RestartRequested

__all__ = ["carry_out_restart", "log_start"]

log = logging.getLogger(__name__)


def carry_out_restart(
    named: int, *, rank: int, site: str, iteration: int, config: ClientConfig, close: Callable[[], None]
) -> None:
    """Rank ``rank`` of ``site`` at ``iteration``: the order names rank ``named``."""
    hook = config.on_restart
    if hook is not None:
        if named == rank:
            hook(named, iteration)
        return
    log.warning(
        "the scheduler ordered rank %d of site %s restarted at iteration %d: closing this context",
        named,
        site,
        iteration,
    )
    close()
    who = "this rank" if named == rank else f"rank {named} of this site"
    raise RestartRequested(
        f"the scheduler asked to restart {who} at iteration {iteration} (a persistent straggler, "
        "AntDT KILL_RESTART); the context is closed. Let the exception end the process: under "
        "`torchrun --max-restarts=N` the elastic agent restarts the site's worker group, which rejoins "
        "the job with its current parameters (set ClientConfig.on_restart to handle it yourself)",
        rank=named,
        iteration=iteration,
        site=site,
    )


def log_start(iteration: int, resume_at: int | None) -> None:
    """Say where this trainer process joins the job: a checkpoint's iteration, or (a process that replaces
    one that stopped) the job's iteration, its parameters to follow by a resync."""
    if resume_at is not None and iteration == resume_at:
        log.info("resuming the job from a checkpoint of iteration %d", iteration)
    elif iteration:
        log.warning(
            "this trainer replaces one that stopped (it crashed, or the scheduler restarted it): starting "
            "at the job's iteration %d (the job's parameters and optimizer state follow by a parameter "
            "resync)",
            iteration,
        )
