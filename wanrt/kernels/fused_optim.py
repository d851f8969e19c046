"""Fused sparse-update kernels: scatter-add and the SGD / momentum / Adam(W) steps, O(nnz).

Each kernel first checks every block index (in range, strictly increasing) and returns an error code
before writing anything, so a bad payload can never cause a wild write. The per-element arithmetic is the
reference's, in the same fp32 order (no fast-math), so results agree with the NumPy path.

Two things make them fast, both measured on 15625 random 16-float blocks of a 25M-element tensor:

* **Prefetch** the lines of the block ``PREFETCH`` positions ahead (parameter, state, step counter): a
  sparse update is a chain of independent random accesses and the out-of-order window alone keeps only a
  couple in flight — 2x (Adam) to 4x (SGD).
* **Vectorise Adam per block.** A whole 16-float block is updated by one vector intrinsic
  (:func:`~wanrt.kernels.fused_intrinsics.adam16`: 16-lane ``sqrt``/``div``), ~4x less compute than 16
  scalar steps; the other kernels are memory-bound and stay plain loops.
* **No array slices in the loops**: a slice is a view whose reference count numba updates atomically,
  which cost more than the Adam arithmetic itself; the kernels index with offsets instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from wanrt.kernels.arrays import Array
from wanrt.kernels.fused_intrinsics import adam16, jit, prefetch
from wanrt.kernels.fused_select import PREFETCH, check_idx

__all__ = ["adam", "momentum", "scatter_add", "sgd"]


@jit
def scatter_add(dense: Array, idx: Array, vals: Array, bs: int, scale: float) -> Any:
    n = dense.shape[0]
    err = check_idx(idx, (n + bs - 1) // bs)
    if err:
        return err
    s = np.float32(scale)
    k = idx.shape[0]
    for j in range(k):
        if j + PREFETCH < k:
            prefetch(dense, idx[j + PREFETCH] * bs)
        o = idx[j] * bs
        jo = j * bs
        if bs == 16 and o + 16 <= n:  # constant trip count: unrolled, no loop overhead
            for e in range(16):
                dense[o + e] = dense[o + e] + s * vals[jo + e]
            continue
        for e in range(min(bs, n - o)):
            dense[o + e] = dense[o + e] + s * vals[jo + e]
    return 0


@jit
def sgd(p: Array, idx: Array, vals: Array, bs: int, lr: float, wd: float) -> Any:
    n = p.shape[0]
    err = check_idx(idx, (n + bs - 1) // bs)
    if err:
        return err
    neg_lr = np.float32(-lr)
    wd32 = np.float32(wd)
    k = idx.shape[0]
    for j in range(k):
        if j + PREFETCH < k:
            prefetch(p, idx[j + PREFETCH] * bs)
        o = idx[j] * bs
        jo = j * bs
        if wd == 0.0 and o + 16 <= n and bs == 16:  # constant trip count: unrolled, no loop overhead
            for e in range(16):
                p[o + e] = p[o + e] + neg_lr * vals[jo + e]
        elif wd == 0.0:  # p + (-lr) * g, exactly as the reference (no "+ 0 * p")
            for e in range(min(bs, n - o)):
                p[o + e] = p[o + e] + neg_lr * vals[jo + e]
        else:
            for e in range(min(bs, n - o)):
                p[o + e] = p[o + e] + neg_lr * (vals[jo + e] + wd32 * p[o + e])
    return 0


@jit
def momentum(
    p: Array,
    buf: Array,
    steps: Array,
    idx: Array,
    vals: Array,
    bs: int,
    lr: float,
    mu: float,
    dampening: float,
    nesterov: bool,
    wd: float,
) -> Any:
    n = p.shape[0]
    err = check_idx(idx, (n + bs - 1) // bs)
    if err:
        return err
    neg_lr = np.float32(-lr)
    mu32 = np.float32(mu)
    damp32 = np.float32(1.0 - dampening)
    wd32 = np.float32(wd)
    k = idx.shape[0]
    for j in range(k):
        if j + PREFETCH < k:
            q = idx[j + PREFETCH]
            prefetch(p, q * bs)
            prefetch(buf, q * bs)
            prefetch(steps, q)
        b = idx[j]
        first = steps[b] == 0
        steps[b] += 1
        o = b * bs
        jo = j * bs
        for e in range(min(bs, n - o)):
            g = vals[jo + e]
            if wd != 0.0:
                g = g + wd32 * p[o + e]
            mb = g if first else mu32 * buf[o + e] + damp32 * g
            buf[o + e] = mb
            d = g + mu32 * mb if nesterov else mb
            p[o + e] = p[o + e] + neg_lr * d
    return 0


@jit
def adam(
    p: Array,
    m: Array,
    v: Array,
    steps: Array,
    idx: Array,
    vals: Array,
    bs: int,
    lr: float,
    bc1: Array,
    bc2_sqrt: Array,
    beta1: float,
    beta2: float,
    eps: float,
    wd: float,
    decoupled: bool,
) -> Any:
    n = p.shape[0]
    err = check_idx(idx, (n + bs - 1) // bs)
    if err:
        return err
    w1 = np.float32(1.0 - beta1)
    b2 = np.float32(beta2)
    omb2 = np.float32(1.0 - beta2)
    wd32 = np.float32(wd)
    eps32 = np.float32(eps)
    decay = np.float32(1.0 - lr * wd)
    l2 = wd != 0.0 and not decoupled
    grad = np.empty(bs, np.float32)  # L2 weight decay: g + wd * p of one block
    k = idx.shape[0]
    for j in range(k):
        if j + PREFETCH < k:
            q = idx[j + PREFETCH]
            prefetch(p, q * bs)
            prefetch(m, q * bs)
            prefetch(v, q * bs)
            prefetch(steps, q)
        b = idx[j]
        t = steps[b] + 1
        if t >= bc1.shape[0]:  # the caller's bound on step counts was wrong: refuse, do not read past
            return 3
        steps[b] = t
        ss = np.float32(lr / bc1[t])
        bc = np.float32(bc2_sqrt[t])
        o = b * bs
        jo = j * bs
        w = min(bs, n - o)
        if wd != 0.0 and decoupled:
            for e in range(w):
                p[o + e] = p[o + e] * decay
        elif l2:
            for e in range(w):
                grad[e] = vals[jo + e] + wd32 * p[o + e]
        if w == 16:  # a whole cache-line block: one vector step
            if l2:
                adam16(p, m, v, grad, o, 0, ss, bc, w1, b2, omb2, eps32)
            else:
                adam16(p, m, v, vals, o, jo, ss, bc, w1, b2, omb2, eps32)
            continue
        for e in range(w):  # element-wise updates, other block sizes, the partial last block
            ge = grad[e] if l2 else vals[jo + e]
            m1 = m[o + e] + w1 * (ge - m[o + e])
            v1 = v[o + e] * b2
            v1 = v1 + (omb2 * ge) * ge
            m[o + e] = m1
            v[o + e] = v1
            p[o + e] = p[o + e] - ss * (m1 / (np.sqrt(v1) / bc + eps32))
    return 0
