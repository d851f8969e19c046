"""Checking that every rank of a site built the same model as its leader, before any gradient moves.

The leader broadcasts its per-layer digests (8 bytes each = one int64, so no pickling); each rank finds the
first layer where its own model differs, and a MIN all-reduce tells every rank the first differing layer of
the whole site, so all ranks raise the same :class:`ModelMismatch` instead of some of them hanging in a
collective the others never reach.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.distributed as dist

from wanrt.client.errors import ModelMismatch
from wanrt.client.link.signature import LayerSignature, first_difference
from wanrt.errors import LocalProtocolError

__all__ = ["check_site_model", "model_signature"]


def model_signature(named_params: Sequence[tuple[str, torch.Tensor]]) -> LayerSignature:
    """The names, shapes and dtypes of the parameters a context binds (what every rank and every site
    must agree on), after checking there are some and each is contiguous (the kernels write in place)."""
    if not named_params:
        raise LocalProtocolError("the optimizer got no trainable parameters")
    for name, p in named_params:
        if not p.is_contiguous():
            raise LocalProtocolError(f"parameter {name!r} is not contiguous", name=name)
    return LayerSignature.of(
        [n for n, _ in named_params],
        [tuple(p.shape) for _, p in named_params],
        [str(p.dtype).removeprefix("torch.") for _, p in named_params],
    )


def check_site_model(
    sig: LayerSignature, *, group: dist.ProcessGroup | None, device: torch.device, max_layers: int
) -> None:
    src = 0 if group is None else dist.get_global_rank(group, 0)
    ours = sig.layer_digests()
    count = torch.tensor([len(sig.names)], dtype=torch.int64, device=device)
    dist.broadcast(count, src=src, group=group)
    n = int(count.item())
    if not 0 <= n <= max_layers:
        raise ModelMismatch(f"site leader announced {n} layers (limit {max_layers})")
    digests = torch.from_numpy(np.frombuffer(ours, dtype=np.int64).copy()).to(device)
    if dist.get_rank(group) != 0:
        digests = torch.zeros(n, dtype=torch.int64, device=device)
    dist.broadcast(digests, src=src, group=group)
    leader = digests.cpu().numpy().tobytes()
    diff = first_difference(ours, leader)
    first = torch.tensor([n + 1 if diff is None else diff], dtype=torch.int64, device=device)
    dist.all_reduce(first, op=dist.ReduceOp.MIN, group=group)
    at = int(first.item())
    if at <= n:  # n + 1 means no rank differs
        raise ModelMismatch(
            f"ranks of this site built different models; first difference at {sig.describe(at)} "
            f"(this rank has {len(sig.names)} layers, the leader {n})",
            layer=at,
            name=sig.names[at] if at < len(sig.names) else None,
        )
