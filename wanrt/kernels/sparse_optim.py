"""Sparse optimizers: apply a COO gradient to a parameter in place, at a cost proportional to its nnz.

StellaTrain §3.1: every parameter is updated independently, so an optimizer step needs to visit only the
elements that received a gradient — 1 % of the work at 99 % compression — instead of decompressing into a
dense gradient first. With cache-line blocks (§3.2) every fetched line of parameter and state is used fully.

What "lazy" means, and where it differs from the dense torch optimizer:

* **SGD** (no momentum) is exactly dense SGD: a zero gradient changes nothing, except that weight decay is
  applied only to the touched elements (dense SGD would also decay untouched ones).
* **Momentum** keeps a buffer per element but updates it, and moves the parameter, only where the gradient
  has a block. Dense momentum keeps moving a parameter by ``lr * mu^j * buf`` for ``j`` steps after its last
  nonzero gradient; the lazy one does not — §3.1 reports the difference as negligible for convergence.
  The first touch of a block initialises its buffer to the gradient, as torch does on the first step.
* **Adam / AdamW** update ``m``, ``v`` and the parameter only on touched blocks, and keep a *step counter per
  block*: a block seen for the t-th time is bias-corrected with ``t``, so its update is exactly the dense
  Adam update of the subsequence of steps in which it was touched. (A global step would make a block's first
  update after a long silence ``(1-b1)/sqrt(1-b2)`` ≈ 3× too large, since the bias correction would already
  have decayed to 1 while ``m`` and ``v`` still start from zero.) Decay of ``m``/``v`` over the skipped steps
  is not applied, as in TF's LazyAdam. AdamW's decoupled decay touches only the updated blocks too.

When every block is touched every step, all four match ``torch.optim`` (tests check this). State is per
parameter key and exportable (:meth:`SparseOptimizer.state_dict`) so a trainer can checkpoint it.
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np

from wanrt.config import check
from wanrt.errors import ConfigError, KernelError
from wanrt.kernels.arrays import (
    Array,
    aligned_zeros,
    as_vector,
    bump_torch_version,
    cuda_stream_ptr,
    forced_env,
    is_cupy_array,
    is_torch_tensor,
    same_streams,
)
from wanrt.kernels.backend import get_kernels, kernels_by_name
from wanrt.kernels.config import AdamConfig, MomentumConfig, SGDConfig
from wanrt.kernels.reference import BiasTables, ReferenceKernels
from wanrt.payload import SparsePayload, n_blocks

__all__ = [
    "OPTIMIZER_KINDS",
    "OptimizerKind",
    "SparseAdam",
    "SparseMomentum",
    "SparseOptimizer",
    "SparseSGD",
    "make_sparse_optimizer",
]

OptimizerKind = Literal["sgd", "momentum", "adam", "adamw"]
OPTIMIZER_KINDS: tuple[str, ...] = ("sgd", "momentum", "adam", "adamw")


@dataclass
class _ParamState:
    """Optimizer state of one parameter: the block size of its updates and the state arrays."""

    block_size: int
    dense_len: int
    arrays: dict[str, Array] = field(default_factory=dict)
    #: upper bound of the per-block step counters (-1: unknown, e.g. just loaded)
    t_max: int = -1


class SparseOptimizer(ABC):
    """Applies sparse updates per parameter key; ``step(key, param, update)`` is the whole interface."""

    kind: str
    #: state arrays: name -> "dense" (one per element, fp32) or "blocks" (one per block, int32)
    _layout: ClassVar[dict[str, str]] = {}

    def __init__(self, lr: float) -> None:
        self._lr = lr
        self._lr_scale = 1.0
        self._state: dict[int, _ParamState] = {}
        self._views: dict[int, tuple[tuple[Any, ...], Array, ReferenceKernels]] = {}  # see _view

    @property
    def lr(self) -> float:
        """The user's learning rate for the next step; settable (learning-rate schedules). The step uses
        :attr:`effective_lr`, this times :attr:`lr_scale`."""
        return self._lr

    @lr.setter
    def lr(self, value: float) -> None:
        check(math.isfinite(value) and value >= 0, "lr", value, "must be finite and >= 0")
        self._lr = float(value)

    @property
    def lr_scale(self) -> float:
        """A factor on :attr:`lr` that the runtime sets (a wanrt job's live ``lr_scale``, STAR §IV-C's
        r_new = (M_new / M) · r when a WAN iteration carries more samples). Kept apart from ``lr`` so that
        a schedule that sets ``lr`` every step neither undoes the scale nor gets it compounded, and so
        that :meth:`state_dict` saves the user's rate, not the job's scale of the moment."""
        return self._lr_scale

    @lr_scale.setter
    def lr_scale(self, value: float) -> None:
        check(math.isfinite(value) and value > 0, "lr_scale", value, "must be finite and > 0")
        self._lr_scale = float(value)

    @property
    def effective_lr(self) -> float:
        """The rate the next step applies: ``lr × lr_scale`` (exactly ``lr`` at scale 1)."""
        return self._lr * self._lr_scale

    def step(self, key: int, param: object, update: SparsePayload) -> None:
        """Apply the (already averaged) sparse gradient ``update`` to ``param`` in place.

        ``param``: 1-D fp32 NumPy array, CuPy array or torch tensor (CPU tensors through their NumPy view,
        CUDA tensors through DLPack: no copy). Indices are bounds-checked before anything is written.
        """
        p, k = self._view(key, param)
        n = int(p.shape[0])
        if update.dense_len != n:
            raise KernelError(
                f"update for key {key} has length {update.dense_len}, parameter has {n}", limit=n, value=key
            )
        if update.nnz_blocks == 0:
            return
        st = self._state_for(key, n, update.block_size, k)
        idx, vals = update.indices, update.values_f32()
        if k.xp is not np:
            # validated on the host (unless the payload was: the codec's check of what it decoded), one
            # asynchronous copy (cupy_staging); a path without staging gets plain copies
            upload = getattr(k, "upload_update", None)
            if upload is not None:
                idx, vals = upload(idx, vals, n_blocks(n, update.block_size), checked=update.validated)
            else:
                idx, vals = k.xp.asarray(idx), k.xp.asarray(vals)
        self._apply(k, p, st, idx, vals, update.block_size)
        bump_torch_version(param)

    def _view(self, key: int, param: object) -> tuple[Array, ReferenceKernels]:
        """``param`` as a writable 1-D array and the kernels for it.

        A CUDA tensor's CuPy view is kept per key while its memory, shape, dtype, the current stream and
        the kernel choice stay the same: building it (torch checks, a CuPy memory wrapper, the stream
        comparison) was a tenth of a GPU step's host time (issue 26). A view that needed DLPack's stream
        handshake (torch's and CuPy's current streams differ) is never kept."""
        if not (is_torch_tensor(param) and param.is_cuda):  # type: ignore[attr-defined]
            p = as_vector(param, "param", writable=True)
            return p, get_kernels(p)
        t: Any = param
        sig = (t.data_ptr(), t.numel(), t.dtype, t.dim(), t.is_contiguous(), cuda_stream_ptr(t), forced_env())
        hit = self._views.get(key)
        if hit is not None and hit[0] == sig:
            return hit[1], hit[2]
        p = as_vector(param, "param", writable=True)
        k = get_kernels(p)
        if p.data.ptr == sig[0] and same_streams(t):
            self._views[key] = (sig, p, k)
        return p, k

    def _state_for(self, key: int, n: int, bs: int, k: ReferenceKernels) -> _ParamState:
        st = self._state.get(key)
        if st is None:
            st = _ParamState(bs, n, t_max=0)
            for name, kind in self._layout.items():
                if kind == "dense":
                    st.arrays[name] = aligned_zeros(k.xp, n, np.float32)
                else:
                    st.arrays[name] = aligned_zeros(k.xp, n_blocks(n, bs), np.int32)
            self._state[key] = st
            return st
        if st.block_size != bs or st.dense_len != n:
            raise KernelError(
                f"key {key}: update has block_size {bs} and length {n}, but the optimizer state was built "
                f"for block_size {st.block_size} and length {st.dense_len}",
                value=key,
            )
        if self._layout and (is_cupy_array(next(iter(st.arrays.values()))) != (k.xp is not np)):
            xp = k.xp
            st.arrays = {a: (xp.asarray(v) if xp is not np else v.get()) for a, v in st.arrays.items()}
        return st

    @abstractmethod
    def _apply(
        self, k: ReferenceKernels, p: Array, st: _ParamState, idx: Array, vals: Array, bs: int
    ) -> None: ...

    @abstractmethod
    def hyper(self) -> dict[str, Any]:
        """Hyperparameters as plain values (what make_sparse_optimizer accepts)."""

    # ------------------------------------------------------------------ checkpointing

    @property
    def state_layout(self) -> dict[str, str]:
        """The state arrays of one parameter: name -> "dense" (fp32 per element) or "blocks" (int32 per
        block), in a fixed order (what :mod:`wanrt.kernels.state_transfer` streams)."""
        return dict(self._layout)

    def state_dict(self) -> dict[str, Any]:
        """Host copies of all state plus the hyperparameters, for a trainer checkpoint."""
        params = {}
        if any(is_cupy_array(a) for st in self._state.values() for a in st.arrays.values()):
            # what the device kernels flagged since the last look (they do no host read per step)
            check_errors = getattr(kernels_by_name("cupy"), "raise_pending_errors", None)
            if check_errors is not None:
                check_errors()
        for key, st in self._state.items():
            arrays = {
                name: np.array(a.get() if is_cupy_array(a) else a, copy=True) for name, a in st.arrays.items()
            }
            params[key] = {"block_size": st.block_size, "dense_len": st.dense_len, **arrays}
        return {"kind": self.kind, "hyper": self.hyper(), "lr": self._lr, "params": params}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output; shapes and dtypes are checked, the kind must match."""
        if state.get("kind") != self.kind:
            raise KernelError(f"state is for a {state.get('kind')!r} optimizer, this is {self.kind!r}")
        lr, params = state.get("lr"), state.get("params")
        if not isinstance(lr, (int, float)) or not isinstance(params, dict):
            raise KernelError("optimizer state needs a numeric 'lr' and a 'params' table")
        self.lr = float(lr)
        restored: dict[int, _ParamState] = {}
        for key, d in params.items():
            try:
                bs, n = int(d["block_size"]), int(d["dense_len"])
            except (KeyError, TypeError, ValueError):
                raise KernelError(f"state of key {key} lacks block_size/dense_len") from None
            if bs < 1 or n < 0:
                raise KernelError(f"state of key {key} has a bad block_size/dense_len", value=(bs, n))
            st = _ParamState(bs, n)
            for name, kind in self._layout.items():
                a = np.asarray(d.get(name))
                want = (n, np.float32) if kind == "dense" else (n_blocks(n, bs), np.int32)
                if a.shape != (want[0],) or a.dtype != want[1]:
                    raise KernelError(
                        f"state {name!r} of key {key} must be {want[1].__name__}[{want[0]}]",
                        value=(a.shape, str(a.dtype)),
                    )
                st.arrays[name] = aligned_zeros(np, a.shape[0], a.dtype)
                st.arrays[name][:] = a
            restored[int(key)] = st
        self._state = restored

    def reset(self, key: int | None = None) -> None:
        """Forget the state of one parameter (or all), and the view kept of it (:meth:`_view`), which holds
        the parameter's memory."""
        if key is None:
            self._state.clear()
            self._views.clear()
        else:
            self._state.pop(key, None)
            self._views.pop(key, None)


class SparseSGD(SparseOptimizer):
    """``p -= lr * (g + wd * p)`` on the touched elements; stateless."""

    kind = "sgd"

    def __init__(self, config: SGDConfig) -> None:
        super().__init__(config.lr)
        self.config = config

    def _apply(
        self, k: ReferenceKernels, p: Array, st: _ParamState, idx: Array, vals: Array, bs: int
    ) -> None:
        k.sgd(p, idx, vals, bs, self.effective_lr, self.config.weight_decay)

    def hyper(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self.config), "lr": self._lr}


class SparseMomentum(SparseOptimizer):
    """SGD with lazy momentum (and optional Nesterov, dampening, L2 weight decay); see module docstring."""

    kind = "momentum"
    _layout: ClassVar[dict[str, str]] = {"momentum_buffer": "dense", "steps": "blocks"}

    def __init__(self, config: MomentumConfig) -> None:
        super().__init__(config.lr)
        self.config = config

    def _apply(
        self, k: ReferenceKernels, p: Array, st: _ParamState, idx: Array, vals: Array, bs: int
    ) -> None:
        c = self.config
        a = st.arrays
        k.momentum(
            p,
            a["momentum_buffer"],
            a["steps"],
            idx,
            vals,
            bs,
            self.effective_lr,
            c.momentum,
            c.dampening,
            c.nesterov,
            c.weight_decay,
        )

    def hyper(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self.config), "lr": self._lr}


class SparseAdam(SparseOptimizer):
    """Lazy Adam, or AdamW with ``decoupled``; bias correction by per-block step counters."""

    _layout: ClassVar[dict[str, str]] = {"exp_avg": "dense", "exp_avg_sq": "dense", "steps": "blocks"}

    def __init__(self, config: AdamConfig) -> None:
        super().__init__(config.lr)
        self.config = config
        self.kind = "adamw" if config.decoupled else "adam"
        self._bias = BiasTables(*config.betas)

    def _apply(
        self, k: ReferenceKernels, p: Array, st: _ParamState, idx: Array, vals: Array, bs: int
    ) -> None:
        c = self.config
        a = st.arrays
        if st.t_max < 0:  # state loaded from a checkpoint: one O(n_blocks) scan, then tracked
            st.t_max = int(a["steps"].max()) if a["steps"].shape[0] else 0  # (cupy's max has no initial=)
        st.t_max += 1  # a block's count grows by at most one per step
        k.adam(
            p,
            a["exp_avg"],
            a["exp_avg_sq"],
            a["steps"],
            idx,
            vals,
            bs,
            self.effective_lr,
            self._bias,
            st.t_max,
            c.eps,
            c.weight_decay,
            c.decoupled,
        )

    def hyper(self) -> dict[str, Any]:
        h = {**dataclasses.asdict(self.config), "lr": self._lr}
        h.pop("decoupled")
        return h


_CONFIGS: dict[str, type[Any]] = {
    "sgd": SGDConfig,
    "momentum": MomentumConfig,
    "adam": AdamConfig,
    "adamw": AdamConfig,
}


def make_sparse_optimizer(kind: OptimizerKind | str, **hyper: Any) -> SparseOptimizer:
    """Build a sparse optimizer; ``hyper`` are the torch.optim-style hyperparameters of that kind.

    ``adamw`` defaults ``weight_decay`` to 0.01 as ``torch.optim.AdamW`` does. Unknown kinds or
    hyperparameters are a :class:`ConfigError` naming them.
    """
    if kind not in _CONFIGS:
        raise ConfigError(f"unknown optimizer {kind!r}; use one of {', '.join(OPTIMIZER_KINDS)}", key="kind")
    cls = _CONFIGS[kind]
    known = {f.name for f in dataclasses.fields(cls)} - {"decoupled"}
    for name in hyper:
        if name not in known:
            raise ConfigError(
                f"unknown hyperparameter {name!r} for {kind}; known: {', '.join(sorted(known))}", key=name
            )
    if "betas" in hyper:
        hyper["betas"] = tuple(hyper["betas"])
    if kind == "sgd":
        return SparseSGD(SGDConfig(**hyper))
    if kind == "momentum":
        return SparseMomentum(MomentumConfig(**hyper))
    if kind == "adamw":
        hyper.setdefault("weight_decay", 1e-2)
        return SparseAdam(AdamConfig(decoupled=True, **hyper))
    return SparseAdam(AdamConfig(**hyper))
