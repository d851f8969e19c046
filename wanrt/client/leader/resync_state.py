"""A site's part in a parameter resync, on the trainer side: pending, discarding, installing, serving.

Two directions (the flow: :mod:`wanrt.client.link.param_resync`, :mod:`gateways.node.resync`,
docs/kill_restart.md):

* **fetching** — the gateway says this site missed the job's rounds (``ResyncStarted``), or the Welcome said
  ``restart_from`` (this process replaces one the scheduler restarted). Until the snapshot is installed the
  leader *holds* the updates that arrive (they may already be in the snapshot), and the site keeps stepping
  but contributes nothing: each layer's push is empty and the error-feedback residuals are dropped, because
  gradients computed at parameters known to differ from the job's would pollute every site's update. The
  snapshot is installed on the leader and broadcast to every rank (with the optimizer state when the
  serving site's optimizer has the same arrays); then the held updates it lacks are applied
  (:meth:`Snapshot.wants`). A resync nobody serves (``ResyncAbandoned``) ends the discarding too, or the
  site would never contribute again.
* **serving** — a peer asks for this site's parameters (``ServeRequested``); the leader answers once every
  update below the asked iteration is applied, with one model copy per answer.

The leader's state changes only between steps (after the push pipeline drained), so every layer of one
iteration is pushed alike and every rank learns the outcome from the leader's decision.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import torch

from wanrt.client.leader.staleness import StalenessTracker
from wanrt.client.link.api import (
    Link,
    ResyncAbandoned,
    ResyncStarted,
    ServeRequested,
    SnapshotArrived,
)
from wanrt.client.link.param_resync import Snapshot, snapshot_frames, snapshot_point
from wanrt.client.site.broadcast import SiteChannel
from wanrt.client.site.decision import SiteUpdate
from wanrt.kernels import SparseOptimizer as KernelOptimizer
from wanrt.kernels.state_transfer import export_state, import_state, state_lengths

__all__ = ["ResyncState"]

log = logging.getLogger(__name__)

#: what the link tells the leader about a parameter resync
ResyncEvent = ResyncStarted | SnapshotArrived | ResyncAbandoned | ServeRequested


class ResyncState:
    """One rank's resync state (the leader's fetch and serve bookkeeping; every rank installs).

    ``reset_residuals`` drops the leader's error-feedback residuals (computed at parameters that were not
    the job's); ``block_size`` is the model's block size (for the optimizer state's layout)."""

    def __init__(
        self,
        params: list[torch.Tensor],
        optimizer: KernelOptimizer,
        channel: SiteChannel,
        *,
        is_leader: bool,
        world_size: int,
        block_size: int,
        reset_residuals: Callable[[], None],
    ) -> None:
        self._params = params
        self._optimizer = optimizer
        self._channel = channel
        self._is_leader = is_leader
        self._world_size = world_size
        self._block_size = block_size
        self._reset_residuals = reset_residuals
        # leader: updates held while a snapshot is on its way, the snapshot to install at the next step,
        # the last one installed (updates it holds are skipped), peers' questions
        self._resync_at: int | None = None
        self._held: list[SiteUpdate] = []
        self._incoming: Snapshot | None = None
        self._snapshot: Snapshot | None = None
        self._serve: list[tuple[int, int, int]] = []  # (request, iteration, state arrays wanted)
        #: leader: this iteration's pushes are empty (a snapshot is pending)
        self.discarding = False
        self._discard_run = 0  # leader: steps left out in the current pending period (for the log)
        self._abandoned = False  # leader: a ResyncAbandoned arrived since the last step

    @property
    def pending(self) -> bool:
        """This site's parameters are not the job's yet (a snapshot is pending or being discarded for)."""
        return self.discarding or self._resync_at is not None or self._incoming is not None

    @property
    def holding(self) -> bool:
        """Updates are held (a snapshot is on its way), so the own payloads do not say where the job goes."""
        return self._resync_at is not None or bool(self._held)

    # -- leader: events and the step's decision ----------------------------------------------------------
    def on_event(self, event: ResyncEvent) -> None:
        """Leader: a parameter resync's event from the link."""
        if isinstance(event, ResyncStarted):
            log.warning(
                "this site missed the job's rounds before iteration %d: fetching the job's "
                "parameters from another site",
                event.iteration,
            )
            self._resync_at = event.iteration
        elif isinstance(event, SnapshotArrived):
            self._incoming = event.snapshot
        elif isinstance(event, ResyncAbandoned):
            self._resync_at = None  # the held updates are applied at this step
            self._abandoned = True
        else:
            self._serve.append((event.request, event.iteration, event.state))

    def take(self, updates: list[SiteUpdate], upto: int | None = None) -> tuple[list[SiteUpdate], bool]:
        """Leader, at a step: the updates the site applies now (held ones included once the snapshot is
        here or abandoned, those the installed snapshot holds skipped), and whether the snapshot is
        installed at this step.

        ``upto``: the step applies exactly the results up to this iteration (the outer loop, where every
        site's parameters are bit-identical after each step). A snapshot that already holds later results
        waits for the step that reaches them: installed now, this site's parameters would be a step ahead
        of the others' (a joining DiLoCo trainer's anchors were the job's of the next outer step)."""
        incoming = self._incoming
        snapshot = incoming is not None and (upto is None or not incoming.ahead_of(upto))
        if snapshot:
            self._snapshot, self._incoming, self._resync_at = incoming, None, None
            updates, self._held = self._held + updates, []
        elif self._resync_at is not None or incoming is not None:
            self._held.extend(updates)  # may already be in the snapshot on its way (or waiting here)
            updates = []
        elif self._held:  # abandoned: nobody sends a snapshot
            updates, self._held = self._held + updates, []
        if self._snapshot is not None:
            snap = self._snapshot
            updates = [u for u in updates if snap.wants(u.iteration, u.layer)]
        return updates, snapshot

    def next_discarding(self, t: int, *, snapshot: bool) -> None:
        """Leader, between steps (the pipeline drained): count iteration ``t`` if it was pushed empty and
        decide whether iteration ``t + 1`` is. Pending from the resync's start until the snapshot is
        installed (at this step's apply when ``snapshot``); a resync nobody will serve (abandoned) ends it
        too, or the site would never contribute again. A replacement process (``restart_from``) is pending
        from its first iteration, before the gateway's resync notice arrives."""
        if self.discarding:
            self._discard_run += 1
        abandoned, self._abandoned = self._abandoned, False
        if snapshot or (abandoned and self._resync_at is None and self._incoming is None):
            if self.discarding:
                self._end_discarding(t + 1, installed=snapshot)
        elif self._resync_at is not None and not self.discarding:
            self.begin_discarding(t + 1)

    def begin_discarding(self, iteration: int) -> None:
        self.discarding = True
        self._discard_run = 0
        self._reset_residuals()  # computed at parameters that were not the job's either
        log.info(
            "parameter resync pending: this site's gradients are left out from iteration %d until the "
            "snapshot is installed (its pushes are empty)",
            iteration,
        )

    def _end_discarding(self, iteration: int, *, installed: bool) -> None:
        self.discarding = False
        self._reset_residuals()  # nothing of the discarded steps may come back later
        n = self._discard_run
        if installed:
            log.info(
                "parameter resync pending: this site's gradients were left out until the snapshot was "
                "installed (%d steps); they count again from iteration %d",
                n,
                iteration,
            )
        else:
            log.warning(
                "parameter resync abandoned after %d steps left out: this site's gradients count again "
                "from iteration %d, on its own parameters",
                n,
                iteration,
            )

    # -- every rank: installing ----------------------------------------------------------------------------
    def install(self) -> None:
        """Every rank: the leader copies the received snapshot into its parameters, the site's other ranks
        receive them by broadcast (so every rank of every site ends with the same parameters). The
        optimizer state (momentum, Adam's moments and step counters) comes with it when the serving site's
        optimizer has the same arrays, and reaches every rank the same way; otherwise each rank keeps its
        own (logged)."""
        with torch.no_grad():
            state: list[np.ndarray] = []
            if self._is_leader:
                assert self._snapshot is not None
                for p, values in zip(self._params, self._snapshot.layers, strict=True):
                    src = torch.from_numpy(values).to(device=p.device, dtype=p.dtype)
                    p.data.view(-1).copy_(src)
                state = self._snapshot.state
                if not state and self.state_lengths:
                    log.warning(
                        "parameter resync: the serving site sent no optimizer state (its optimizer differs "
                        "from this one); this site keeps its own"
                    )
            if self._world_size > 1:
                self._channel.params(self._params)
                state = self._channel.optimizer_state(state, self.state_lengths)
            if state:
                import_state(self._optimizer, self._dense_lens, self._block_size, state)

    # -- leader: serving -----------------------------------------------------------------------------------
    def serve(self, link: Link | None, tracker: StalenessTracker[SiteUpdate] | None) -> None:
        """Leader: answer the peers' questions whose iteration every applied update has reached: the
        parameters now hold every update of the iterations below K and the ones listed beyond (one model
        copy per answer, made only while a question is pending)."""
        if not self._serve or link is None or tracker is None:
            return
        send = getattr(link, "send_params", None)
        if send is None or self.pending:
            return  # this site's own parameters are not the job's yet (or the link cannot answer)
        snap = self._snapshot
        pending = {k for k in tracker.unapplied() if snap is None or snap.wants(*k)}
        pushed = tracker.last_pushed + 1
        in_snap = frozenset() if snap is None else snap.extras
        high = max([pushed, *(it + 1 for it, _ in in_snap)])
        low = min((it for it, _ in pending), default=pushed)
        if snap is not None:
            low = max(low, snap.iteration)  # every update below it is in the installed snapshot

        def applied(i: int, layer: int) -> bool:
            return (i, layer) in in_snap or (i < pushed and (i, layer) not in pending)

        keep = []
        for request, iteration, state in self._serve:
            point = snapshot_point(iteration, low, applied, high, len(self._params))
            if point is None:
                keep.append((request, iteration, state))
                continue
            layers = [p.detach().reshape(-1).to("cpu", torch.float32).numpy() for p in self._params]
            # the optimizer state too when the asker's optimizer has the same arrays (else it keeps its own)
            arrays = self._state_arrays() if state and state == len(self.state_lengths) else []
            send(list(snapshot_frames(request, point[0], point[1], layers, state=arrays)))
        self._serve = keep

    @property
    def state_lengths(self) -> tuple[int, ...]:
        """This rank's optimizer state arrays' lengths (:mod:`wanrt.kernels.state_transfer`)."""
        return state_lengths(self._optimizer, self._dense_lens, self._block_size)

    @property
    def _dense_lens(self) -> list[int]:
        return [p.numel() for p in self._params]

    def _state_arrays(self) -> list[np.ndarray]:
        return export_state(self._optimizer, self._dense_lens, self._block_size)
