"""A KILL_RESTART order at the gateway: check it, forward it once, let the replacement trainer in. Sans-IO.

The scheduler's straggler policy orders a persistent straggler rank restarted (AntDT §V-E3) as
``restart@<site>`` = rank in a decision; this site's gateway sees it as ``restart`` = rank
(:func:`wanrt.protocol.scheduler.messages.site_values`). What the gateway adds:

1. **Prepare**: the rank must exist at this site (its trainer's last report says the site's world size);
   otherwise the decision is refused with that problem, like a plan naming an unknown site.
2. **Commit**: the ConfigUpdate carrying ``restart`` goes to the trainer session connected now, once. The
   update kept for later sessions (and reported to the scheduler as ``cfg.*``) leaves it out, so neither
   the replacement trainer nor a restarted scheduler that adopts the job's settings restarts anyone again.
3. **Replacement**: a gateway refuses a trainer of another *run* once it has counted pushes (it would take
   the new run's pushes for the old one's re-sends). An order that is committed and not yet used lets the
   next new run in, once: it starts at the first iteration the old trainer did not push (at least the
   order's iteration; the Welcome's ``restart_from``), and the gateway starts a parameter resync for that
   iteration, so the new process fetches the job's parameters and optimizer state from a running site
   (gateways.node.resync).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from wanrt.live_settings import RESTART_KEY

__all__ = ["RestartOrder", "TrainerRestart"]

log = logging.getLogger("gateways.node")


@dataclass(frozen=True, slots=True)
class RestartOrder:
    decision: int
    rank: int
    effective_iteration: int


class TrainerRestart:
    """The one outstanding restart order of this site (a newer order replaces it)."""

    def __init__(self) -> None:
        self.order: RestartOrder | None = None
        self.replaced = 0  # replacement trainer runs let in

    @staticmethod
    def problem(values: Mapping[str, Any], world_size: float | None) -> str | None:
        """Why this site cannot carry out ``values``' restart order (None: it can, or there is none)."""
        rank = values.get(RESTART_KEY)
        if rank is None:
            return None
        if world_size is None:
            return f"restart of rank {rank}: this site's trainer has not reported its ranks yet"
        if not (type(rank) is int and 0 <= rank < int(world_size)):
            return f"restart of rank {rank}: this site's trainer has {int(world_size)} ranks"
        return None

    def committed(self, decision: int, values: Mapping[str, Any], effective: int) -> dict[str, Any]:
        """Record the order in ``values`` (if any); returns the values to keep for later trainer sessions:
        without the order."""
        rank = values.get(RESTART_KEY)
        if rank is None:
            return dict(values)
        self.order = RestartOrder(decision, int(rank), effective)
        log.warning("decision %d: this site's rank %d restarts at iteration %d", decision, rank, effective)
        return {k: v for k, v in values.items() if k != RESTART_KEY}

    def start_at(self, next_push: int) -> int | None:
        """Where a replacement trainer starts (None: no order outstanding): at the order's iteration, or
        later if the old trainer pushed beyond it (its pushes must keep increasing per layer)."""
        if self.order is None:
            return None
        return max(self.order.effective_iteration, next_push)

    def admit(self) -> bool:
        """A trainer of a new run asks in: let it in if an order is outstanding (and use the order up)."""
        if self.order is None:
            return False
        log.warning(
            "a new trainer run replaces the one decision %d restarted (rank %d)",
            self.order.decision,
            self.order.rank,
        )
        self.order = None
        self.replaced += 1
        return True
