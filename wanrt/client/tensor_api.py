"""``ctx.all_reduce(name, tensor)``: average any tensor across sites through the gateways.

What hivemind's ``DecentralizedAverager`` offers (a fixed set of tensors, averaged across peers on request),
with wanrt's codecs and guarantees: the tensors are compressed by the site leader like gradients (the
config's density with error feedback, the negotiated wire dtype incl. int8/int4/int2), summed by the
gateways, and every rank of every site gets the same average.

Why tensors are registered first, by name and shape: the gateways learn a job's layer set once, from the
model signature each site sends when its trainer attaches (``LayerSignature``, checked against the other
sites'); a round is one (iteration, layer) that every site pushes. Registering the tensors is that
signature, so two sites that register different shapes fail at registration with :class:`ModelMismatch`,
exactly as two different models do, and no round ever mixes different tensors.

How a call maps onto the runtime: each registered tensor is one layer of the context (a buffer this module
owns), and each ``all_reduce`` is one WAN iteration (``ctx.iteration`` + 1). The named tensor's layer
carries the tensor, every other registered layer an all-zero push (nothing on the wire once compressed).
The result is added by a kernel into the name's buffer (:class:`_AverageInto`); the context
runs synchronously (staleness 0 whatever the config says), so a call returns its own average.

Collective: every rank of every site calls ``all_reduce`` with the same names in the same order, as
``torch.distributed.all_reduce``. The async form pushes at once (the leader compresses and sends from its
worker thread) and ``handle.wait()`` collects: the caller's work between them overlaps the exchange.
With ``density < 1`` or a low-bit wire dtype, what a call does not send stays in the error-feedback
residual of its layer; every later call pushes every layer, so the sites' leftovers keep arriving, and they
are collected in that name's buffer and returned with its next call: over a run, what the calls of a name
returned plus what the residuals still hold is the average of everything passed in (nothing is lost, part
of it arrives late; use ``ClientConfig.dense_baseline()`` for exact averages every call). A context
drives either a model (a SparseOptimizer or DiLoCo) or registered tensors, not both (docs/outer_loop.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from wanrt.client.errors import TensorMismatch, UnknownTensor, UnsupportedTensorDtype
from wanrt.errors import ConfigError, LocalProtocolError
from wanrt.kernels.config import SGDConfig
from wanrt.kernels.sparse_optim import SparseSGD

if TYPE_CHECKING:
    from wanrt.client.context import Context

__all__ = ["AllReduceHandle", "TensorAverager"]

#: the reductions offered; the gateways sum and every rank divides by the contributing sites
OPS = ("mean",)


class _AverageInto(SparseSGD):
    """``p -= 1 · update`` on the touched blocks, whatever the job's ``lr_scale``: with ``p`` zeroed and the
    pushed values negated, ``p`` becomes the average exactly (0 − (−x) = x in fp32)."""

    def __init__(self) -> None:
        super().__init__(SGDConfig(lr=1.0))

    @property
    def effective_lr(self) -> float:
        return 1.0


class AllReduceHandle:
    """An ``all_reduce_async`` in flight: :meth:`wait` returns the average (a new tensor, the input's
    dtype and device)."""

    def __init__(self, owner: TensorAverager, name: str, like: torch.Tensor) -> None:
        self._owner = owner
        self.name = name
        self._like = like
        self._result: torch.Tensor | None = None

    @property
    def done(self) -> bool:
        return self._result is not None

    def wait(self) -> torch.Tensor:
        if self._result is None:
            out = self._owner.finish(self)
            self._result = out.to(dtype=self._like.dtype, device=self._like.device)
        return self._result


class TensorAverager:
    """The registered tensors of one context (``ctx.register_tensors``)."""

    def __init__(self, ctx: Context, tensors: Mapping[str, torch.Tensor | tuple[int, ...]]) -> None:
        if not tensors:
            raise ConfigError("register_tensors() got no tensors", key="tensors")
        self._names: list[str] = []
        self._buffers: list[torch.Tensor] = []
        for name, t in tensors.items():
            if not isinstance(name, str) or not name:
                raise ConfigError(f"tensor names must be non-empty strings, got {name!r}", key="tensors")
            if isinstance(t, torch.Tensor):
                if not t.dtype.is_floating_point:
                    raise UnsupportedTensorDtype(name, str(t.dtype).removeprefix("torch."))
                shape = tuple(t.shape)
            else:
                shape = tuple(t)
            if math.prod(shape) < 1:
                raise ConfigError(f"tensor {name!r} has no elements (shape {shape})", key="tensors")
            self._names.append(name)
            # a leaf that requires grad: the context's reduce hooks bind to it like to a parameter
            self._buffers.append(torch.zeros(shape, dtype=torch.float32, requires_grad=True))
        self._ctx = ctx
        self._pending: AllReduceHandle | None = None
        ctx.attach(
            [(f"tensor:{n}", b) for n, b in zip(self._names, self._buffers, strict=True)],
            _AverageInto(),
            outer_loop=True,
            synchronous=True,
        )

    @property
    def names(self) -> list[str]:
        return list(self._names)

    def start(self, name: str, tensor: torch.Tensor, op: str) -> AllReduceHandle:
        if op not in OPS:
            raise ConfigError(f"all_reduce op {op!r} is not offered; use one of {', '.join(OPS)}", key="op")
        if name not in self._names:
            raise UnknownTensor(name, self._names)
        if not isinstance(tensor, torch.Tensor) or not tensor.dtype.is_floating_point:
            dtype = str(tensor.dtype).removeprefix("torch.") if isinstance(tensor, torch.Tensor) else "?"
            raise UnsupportedTensorDtype(name, dtype)
        i = self._names.index(name)
        if tuple(tensor.shape) != tuple(self._buffers[i].shape):
            raise TensorMismatch(name, tuple(self._buffers[i].shape), tuple(tensor.shape))
        if self._pending is not None:
            raise LocalProtocolError(
                f"all_reduce({name!r}) while all_reduce({self._pending.name!r}) is still in flight",
                hint="wait() for the previous handle first (one all_reduce at a time, in the same order "
                "at every site)",
            )
        with torch.no_grad():
            for j, b in enumerate(self._buffers):
                if j == i:
                    b.grad = tensor.detach().to(device=b.device, dtype=torch.float32).neg().contiguous()
                else:
                    b.grad = torch.zeros_like(b)
        self._ctx.outer_exchange.begin()
        handle = self._pending = AllReduceHandle(self, name, tensor)
        return handle

    def finish(self, handle: AllReduceHandle) -> torch.Tensor:
        if handle is not self._pending:
            raise LocalProtocolError(f"this all_reduce({handle.name!r}) handle was already collected")
        try:
            self._ctx.outer_exchange.end()
        finally:
            self._pending = None
            for b in self._buffers:
                b.grad = None
        buf = self._buffers[self._names.index(handle.name)]
        out = buf.detach().clone()
        with torch.no_grad():
            buf.zero_()  # the other names' buffers keep what their residuals sent meanwhile
        return out
