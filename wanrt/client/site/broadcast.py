"""Moving the leader's decision to every rank of the site over torch.distributed.

Three broadcasts per step at most (fixed-size header, then body and values only when non-empty), rooted at
rank 0 of the site's process group. NCCL can only broadcast device tensors, so the arrays are staged on the
group's device; gloo uses CPU tensors directly.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from wanrt.client.errors import LeaderFailed
from wanrt.client.site.decision import HEADER_LEN, SiteDecision, decode_body, decode_header, encode

__all__ = ["SiteChannel"]


class SiteChannel:
    """Broadcast :class:`SiteDecision` objects from the site leader (group rank 0) to the other ranks."""

    def __init__(self, group: dist.ProcessGroup | None, device: torch.device, *, max_elements: int) -> None:
        self._group = group
        self._world = dist.get_world_size(group)
        self._device = device
        self._src = 0 if group is None else dist.get_global_rank(group, 0)
        self._max = max_elements

    def _bcast(self, t: torch.Tensor) -> torch.Tensor:
        t = t.to(self._device)
        dist.broadcast(t, src=self._src, group=self._group)
        return t.cpu()

    def send(self, decision: SiteDecision) -> None:
        header, body, values = encode(decision)
        self._bcast(torch.from_numpy(header))
        if body.shape[0]:
            self._bcast(torch.from_numpy(body))
        if values.shape[0]:
            self._bcast(torch.from_numpy(values))

    def params(self, tensors: list[torch.Tensor]) -> None:
        """Every rank: the leader's parameters into every rank's own tensors (a parameter resync installed
        on the leader reaches the whole site; the shapes are the model's, checked at attach)."""
        with torch.no_grad():
            for p in tensors:
                if self._group is None and not dist.is_initialized():
                    continue
                staged = p.data.to(self._device)
                dist.broadcast(staged, src=self._src, group=self._group)
                if staged is not p.data:
                    p.data.copy_(staged)

    def optimizer_state(self, state: list[np.ndarray], lengths: tuple[int, ...]) -> list[np.ndarray]:
        """Every rank: the optimizer state the leader installs with a parameter resync (``state``, empty if
        the snapshot had none), so every rank's optimizer takes the same. Other ranks pass ``[]`` and get
        the leader's; ``lengths`` are the arrays' (the same at every rank: same optimizer, same model)."""
        if self._group is None and not dist.is_initialized():
            return state
        flag = self._bcast(torch.tensor([1 if state else 0], dtype=torch.int64))
        if not int(flag[0]):
            return []
        mine = state or [np.zeros(n, np.float32) for n in lengths]
        return [self._bcast(torch.from_numpy(np.ascontiguousarray(a, np.float32))).numpy() for a in mine]

    def send_outcome(self, decision: SiteDecision, failure: BaseException | None) -> None:
        """Leader: the decision to every rank, or the leader's failure (then raised here too), so a failure
        on the leader stops the whole site with its message instead of a hang."""
        # a site of one rank has nobody to tell: three gloo broadcasts (and the encoding of every update
        # into them) cost ~1 ms per step for nothing (docs/client.md, "Where an iteration's time goes")
        if self._world > 1:
            if failure is None:
                self.send(decision)
                return
            self.send(SiteDecision(error=(type(failure).__name__, str(failure))))
        if failure is not None:
            raise failure

    def recv_checked(self) -> SiteDecision:
        """The other ranks: the leader's decision, or its failure as :class:`LeaderFailed`."""
        decision = self.recv()
        if decision.error is not None:
            raise LeaderFailed(*decision.error)
        return decision

    def recv(self) -> SiteDecision:
        header = self._bcast(torch.zeros(HEADER_LEN, dtype=torch.int64)).numpy()
        n_body, n_val = decode_header(header, max_elements=self._max)
        body = np.zeros(0, dtype=np.int64)
        values = np.zeros(0, dtype=np.float32)
        if n_body:
            body = self._bcast(torch.zeros(n_body, dtype=torch.int64)).numpy()
        if n_val:
            values = self._bcast(torch.zeros(n_val, dtype=torch.float32)).numpy()
        return decode_body(header, body, values)
