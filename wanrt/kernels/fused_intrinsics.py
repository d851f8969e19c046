"""Building blocks of the fused CPU path: the numba decorator and five LLVM intrinsics.

numba turns off LLVM's SLP vectoriser (it miscompiled, numba#8705), so the natural way to write a 16-float
block sum — sixteen scalar ``abs`` and a tree of adds — stays scalar, and numba has no prefetch. Rather than
a C extension (a build step and a compiler on every target), six tiny intrinsics emit the exact LLVM
vector IR we want; everything else stays plain numba:

* :func:`block_sum16` — one 64-byte block: load ``<16 x float>``, ``fabs``, then the *halving tree*
  ``a[j] + a[j+8]``, ``+ a[j+4]``, ``+ a[j+2]``, ``+ a[j+1]``. Same order as the NumPy reference
  (:mod:`wanrt.kernels.reference`), no fast-math, so the sums are bit-identical.
* :func:`hits16` — bitmask of the 16 lanes with ``not (|x| < v)`` (NaN counts as a hit, so it is seen),
  walked with :func:`lowest_bit` (``llvm.cttz``).
* :func:`add16` — ``x[i:i+16] += a[i:i+16]`` as one vector load-add-store: error feedback's residual
  update inside the select pass, so the residual's cache line is written back with the gradient in it
  while the block sum reads it from a register (the plain loop over a range did not vectorise: 1.9 ms
  against 0.7 ms for 5 M floats, docs/round_bench.md "Session 12").
* :func:`adam16` — one Adam step on a 16-float block (vector ``sqrt``/``div``, same fp32 order).
* :func:`prefetch` — ``llvm.prefetch`` for writing: sparse updates are chains of independent random
  accesses, and prefetching a dozen blocks ahead keeps enough of them in flight.

:func:`jit` is ``numba.njit(nogil=True, cache=True)``; when no cache location is writable (this directory,
``NUMBA_CACHE_DIR``, the user cache) it compiles without caching instead of failing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numba
from llvmlite import ir  # type: ignore[import-untyped]  # ships without type information
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["add16", "block_sum16", "caching", "hits16", "jit", "prefetch"]

F = TypeVar("F", bound=Callable[..., Any])

_uncached: list[str] = []


def caching() -> bool:
    """Whether every compiled kernel is cached on disk (False if some had no writable cache location)."""
    return not _uncached


def jit(fn: F) -> F:
    """``numba.njit`` with on-disk caching when a cache location is writable, without it otherwise."""
    opts: dict[str, Any] = {"nogil": True, "boundscheck": False, "error_model": "numpy"}
    try:
        return numba.njit(cache=True, **opts)(fn)
    except RuntimeError:  # "cannot cache function ...: no locator available for file ..."
        _uncached.append(getattr(fn, "__qualname__", repr(fn)))
        return numba.njit(cache=False, **opts)(fn)


_I32 = ir.IntType(32)
_V16 = ir.VectorType(ir.FloatType(), 16)


def _element_ptr(context: Any, builder: Any, aryty: Any, ary: Any, index: Any) -> Any:
    data = context.make_array(aryty)(context, builder, ary).data
    return builder.gep(data, [index])


def _load16(context: Any, builder: Any, aryty: Any, ary: Any, index: Any) -> Any:
    ptr = _element_ptr(context, builder, aryty, ary, index)
    vec = builder.load(builder.bitcast(ptr, _V16.as_pointer()), align=4)
    fabs = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V16, [_V16]), "llvm.fabs.v16f32")
    return builder.call(fabs, [vec])


def _half_sum(builder: Any, vec: Any, width: int) -> Any:
    mask = ir.VectorType(_I32, width)
    lo = builder.shuffle_vector(vec, vec, ir.Constant(mask, [_I32(i) for i in range(width)]))
    hi = builder.shuffle_vector(vec, vec, ir.Constant(mask, [_I32(i + width) for i in range(width)]))
    return builder.fadd(lo, hi)


def _block_sum16(typingctx: Any, arr: Any, index: Any) -> Any:
    """fp32 sum of |arr[index : index+16]| by the halving tree (the caller guarantees the bounds)."""
    sig = types.float32(arr, index)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        a = _load16(context, builder, signature.args[0], args[0], args[1])
        s2 = _half_sum(builder, _half_sum(builder, _half_sum(builder, a, 8), 4), 2)
        return builder.fadd(builder.extract_element(s2, _I32(0)), builder.extract_element(s2, _I32(1)))

    return sig, codegen


def _add16(typingctx: Any, x: Any, add: Any, index: Any) -> Any:
    """``x[index : index+16] += add[index : index+16]`` in fp32 (the caller guarantees the bounds); IEEE
    vector adds round like the scalar ones, so the result is bit-identical to the element loop."""
    sig = types.void(x, add, index)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        px, pa = (
            builder.bitcast(
                _element_ptr(context, builder, signature.args[i], args[i], args[2]), _V16.as_pointer()
            )
            for i in (0, 1)
        )
        total = builder.fadd(builder.load(px, align=4), builder.load(pa, align=4))
        builder.store(total, px, align=4)
        return context.get_dummy_value()

    return sig, codegen


def _hits16(typingctx: Any, arr: Any, index: Any, v: Any) -> Any:
    """Bit j set iff ``not (|arr[index + j]| < v)`` for j < 16 (unordered compare: NaN sets its bit)."""
    sig = types.int64(arr, index, v)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        a = _load16(context, builder, signature.args[0], args[0], args[1])
        splat = builder.insert_element(ir.Constant(_V16, ir.Undefined), args[2], _I32(0))
        splat = builder.shuffle_vector(splat, splat, ir.Constant(ir.VectorType(_I32, 16), [_I32(0)] * 16))
        bits = builder.bitcast(builder.fcmp_unordered(">=", a, splat), ir.IntType(16))
        return builder.zext(bits, ir.IntType(64))

    return sig, codegen


def _prefetch(typingctx: Any, arr: Any, i: Any) -> Any:
    """``llvm.prefetch`` of ``&arr[i]`` for writing, into all cache levels; never faults.

    A sparse update is a chain of independent random accesses (parameter, moments, step counter of each
    block); the out-of-order window alone keeps only a couple of them in flight, so the kernels prefetch
    the lines of the block ``PREFETCH`` positions ahead: measured 2x (Adam) to 4x (SGD) on 15625 random
    blocks of a 25M-element tensor.
    """
    sig = types.void(arr, i)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        ptr = _element_ptr(context, builder, signature.args[0], args[0], args[1])
        fnty = ir.FunctionType(ir.VoidType(), [cgutils.voidptr_t, _I32, _I32, _I32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        # rw=1 (we are about to write the line), locality=3 (keep in all levels), cache type 1 (data)
        builder.call(fn, [builder.bitcast(ptr, cgutils.voidptr_t), _I32(1), _I32(3), _I32(1)])
        return context.get_dummy_value()

    return sig, codegen


def _lowest_bit(typingctx: Any, mask: Any) -> Any:
    """Index of the lowest set bit of a nonzero int64 (``llvm.cttz``), to walk a hit mask in O(hits)."""
    sig = types.int64(mask)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        i64 = ir.IntType(64)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(i64, [i64, ir.IntType(1)]), "llvm.cttz.i64"
        )
        return builder.call(fn, [args[0], ir.IntType(1)(1)])

    return sig, codegen


def _adam16(
    typingctx: Any,
    p: Any,
    m: Any,
    v: Any,
    g: Any,
    o: Any,
    go: Any,
    step_size: Any,
    bc2_sqrt: Any,
    w1: Any,
    b2: Any,
    omb2: Any,
    eps: Any,
) -> Any:
    """Adam on 16 lanes: ``p, m, v [o:o+16]`` updated from ``g[go:go+16]``, in the scalar code's fp32 order.

    ``m += w1*(g-m)``; ``v = v*b2 + (omb2*g)*g``; ``p -= step_size * (m / (sqrt(v)/bc2_sqrt + eps))``.
    IEEE vector ops round exactly like their scalar forms, so this equals the reference bit for bit; LLVM's
    loop vectoriser does not reliably vectorise a 16-trip loop (it unrolls it first, and numba keeps the
    SLP vectoriser off), so the 16 ``sqrt``/``div`` would otherwise run one at a time.
    """
    sig = types.void(p, m, v, g, o, go, step_size, bc2_sqrt, w1, b2, omb2, eps)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        tys = signature.args
        ptrs = [
            builder.bitcast(
                _element_ptr(context, builder, tys[i], args[i], args[4 if i < 3 else 5]), _V16.as_pointer()
            )
            for i in range(4)
        ]
        x, mv, vv, gv = (builder.load(ptr, align=4) for ptr in ptrs)

        def splat(value: Any) -> Any:
            one = builder.insert_element(ir.Constant(_V16, ir.Undefined), value, _I32(0))
            return builder.shuffle_vector(one, one, ir.Constant(ir.VectorType(_I32, 16), [_I32(0)] * 16))

        ss, bc, w1v, b2v, omb2v, epsv = (splat(a) for a in args[6:])
        m1 = builder.fadd(mv, builder.fmul(w1v, builder.fsub(gv, mv)))
        v1 = builder.fadd(builder.fmul(vv, b2v), builder.fmul(builder.fmul(omb2v, gv), gv))
        sqrt = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_V16, [_V16]), "llvm.sqrt.v16f32"
        )
        den = builder.fadd(builder.fdiv(builder.call(sqrt, [v1]), bc), epsv)
        x1 = builder.fsub(x, builder.fmul(ss, builder.fdiv(m1, den)))
        builder.store(m1, ptrs[1], align=4)
        builder.store(v1, ptrs[2], align=4)
        builder.store(x1, ptrs[0], align=4)
        return context.get_dummy_value()

    return sig, codegen


adam16: Any = intrinsic(_adam16)
add16: Any = intrinsic(_add16)
block_sum16: Any = intrinsic(_block_sum16)
lowest_bit: Any = intrinsic(_lowest_bit)
hits16: Any = intrinsic(_hits16)
prefetch: Any = intrinsic(_prefetch)
