"""A sparse optimizer's state as flat fp32 arrays, for a parameter resync (docs/chaos.md).

A site whose trainer missed rounds gets the job's parameters from a running site; with a stateful optimizer
(momentum, Adam) it also needs that site's optimizer state, or its next updates differ from everyone
else's for good (every rank of every site applies the same sparse updates to the same state, so the state
is the job's, like the parameters). The resync carries fp32 arrays in layer order, so the state travels as
more of them: for each parameter key 0..n-1, each array of :attr:`SparseOptimizer.state_layout` in its
order. ``blocks`` arrays (per-block step counters, int32) travel as fp32, exact below 2**24 steps; a
value that is not a whole number in that range is refused on the way in.

Only public optimizer APIs are used (``state_dict`` / ``load_state_dict``), so the same checks apply as
for a checkpoint. The lengths depend on the kind, the parameters' lengths and the block size, which every
rank of every site of a job shares; a site whose optimizer differs gets lengths that differ, and the
resync then carries the parameters alone (:mod:`wanrt.client.link.param_resync`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from wanrt.errors import KernelError
from wanrt.kernels.sparse_optim import SparseOptimizer
from wanrt.payload import n_blocks

__all__ = ["MAX_EXACT_STEPS", "export_state", "import_state", "state_lengths"]

#: Step counters travel as fp32: every whole number up to 2**24 is exact.
MAX_EXACT_STEPS = 1 << 24


def state_lengths(opt: SparseOptimizer, dense_lens: Sequence[int], block_size: int) -> tuple[int, ...]:
    """The lengths of the arrays :func:`export_state` returns (empty for a stateless optimizer)."""
    out = []
    for n in dense_lens:
        for kind in opt.state_layout.values():
            out.append(int(n) if kind == "dense" else n_blocks(int(n), block_size))
    return tuple(out)


def export_state(opt: SparseOptimizer, dense_lens: Sequence[int], block_size: int) -> list[np.ndarray]:
    """Host fp32 copies of the state, in :func:`state_lengths` order; a parameter never updated yet has
    zeros (what its state starts from)."""
    params = opt.state_dict()["params"]
    want = state_lengths(opt, dense_lens, block_size)
    out: list[np.ndarray] = []
    names = list(opt.state_layout)
    for key, _ in enumerate(dense_lens):
        st = params.get(key)
        for name in names:
            n = want[len(out)]
            if st is None:
                out.append(np.zeros(n, np.float32))
                continue
            a = np.asarray(st[name])
            if a.shape != (n,):
                raise KernelError(
                    f"optimizer state {name!r} of layer {key} has {a.shape[0]} values, expected {n} "
                    f"(block size {st['block_size']} here, {block_size} asked)",
                    value=key,
                )
            out.append(a.astype(np.float32, copy=False))  # state_dict already copied it
    return out


def import_state(
    opt: SparseOptimizer, dense_lens: Sequence[int], block_size: int, arrays: Sequence[np.ndarray]
) -> None:
    """Replace the optimizer's state with ``arrays`` (:func:`export_state` of another site). Checked in
    full before anything changes; the learning rate stays this optimizer's own."""
    want = state_lengths(opt, dense_lens, block_size)
    if tuple(int(np.asarray(a).size) for a in arrays) != want:
        raise KernelError("optimizer state arrays do not fit this optimizer and model", value=len(arrays))
    layout = list(opt.state_layout.items())
    params: dict[int, dict[str, object]] = {}
    it = iter(arrays)
    for key, n in enumerate(dense_lens):
        entry: dict[str, object] = {"block_size": block_size, "dense_len": int(n)}
        for name, kind in layout:
            a = np.asarray(next(it), dtype=np.float32).reshape(-1)
            if not np.isfinite(a).all():
                raise KernelError(f"optimizer state {name!r} of layer {key} holds NaN or Inf", value=key)
            if kind == "blocks":
                if a.size and (a.min() < 0 or a.max() > MAX_EXACT_STEPS or (a != np.round(a)).any()):
                    raise KernelError(
                        f"step counters of layer {key} are not whole numbers in range", value=key
                    )
                entry[name] = a.astype(np.int32)
            else:
                entry[name] = a  # load_state_dict copies it into the optimizer's own arrays
        params[key] = entry
    opt.load_state_dict({"kind": opt.kind, "hyper": opt.hyper(), "lr": opt.lr, "params": params})
