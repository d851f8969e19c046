"""The site leader's worker thread: wait for a layer's in-site reduce, compress it, push it.

Running this off the training thread lets the leader compress layer ``l`` and hand it to the link while
autograd is still computing the layers below (StellaTrain §3.3, Fig. 4(b): compression and communication
overlap the backward pass). One worker keeps layers in issue order, which is also the order the gateway's
EDF queue wants them. Errors are kept and re-raised in the training thread by :meth:`drain`.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

__all__ = ["LeaderPipeline"]

#: (iteration, layer, pending in-site reduce or None, gradient tensor) -> None
Job = Callable[[int, int, Any, torch.Tensor], None]


class LeaderPipeline:
    """A one-thread queue of per-layer jobs with a barrier (:meth:`drain`) at the end of each step."""

    def __init__(self, job: Job) -> None:
        self._job = job
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wanrt-leader")
        self._pending: list[Future[None]] = []

    def submit(self, iteration: int, layer: int, work: Any, grad: torch.Tensor) -> None:
        self._pending.append(self._pool.submit(self._job, iteration, layer, work, grad))

    def drain(self) -> None:
        """Wait for every submitted job; re-raise the first failure."""
        pending, self._pending = self._pending, []
        first: BaseException | None = None
        for fut in pending:
            exc = fut.exception()
            if exc is not None and first is None:
                first = exc
        if first is not None:
            raise first

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
