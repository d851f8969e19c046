"""Host cost of each part of a sparse step and a selection on a GPU, unprofiled (profilers inflate exactly
these microsecond calls): each part alone, ``--reps`` times back to back, in µs per call.

Why: on an H200 a sparse Adam step from a pinned update took 0.25 ms on the host against 0.03 ms on the
device (issue 26); this says which call the 0.25 ms is made of. ``python tools/gpu_micro.py [--out FILE]``;
needs CUDA and CuPy (prints why not otherwise).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import torch

from tools.bench_gpu import BLOCK, DENSITY, _pinned_updates, _update
from tools.gpu_profile import _unprofiled


def _us(fn: Callable[[], object], reps: int) -> float:
    """µs per call the host takes to queue ``reps`` back-to-back calls, after 20 warm-up calls."""
    for _ in range(20):
        fn()
    return 1e6 * _unprofiled(fn, reps, cuda=True)[0]


def _traced_step(opt: Any, p: torch.Tensor, pinned: list[Any], reps: int) -> list[tuple[str, float]]:
    """The whole pinned step with each function it calls wrapped in a timer: inclusive µs per step of
    each (the wrappers add ~0.3 µs per call)."""
    import wanrt.kernels.cupy_kernels as ck
    import wanrt.kernels.cupy_staging as cs
    import wanrt.kernels.sparse_optim as so

    spent: dict[str, float] = {}

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t0

        return wrapper

    targets = [
        (so, "as_vector"),
        (so, "get_kernels"),
        (so, "bump_torch_version"),
        (so.SparseOptimizer, "_state_for"),
        (so.SparseAdam, "_apply"),
        (ck.CupyKernels, "upload_update"),
        (ck.CupyKernels, "adam"),
        (ck.CupyKernels, "_function"),
        (ck.CupyKernels, "_launched"),
        (ck.CupyKernels, "check_indices"),
        (ck, "check_block_indices"),
        (cs.PinnedStaging, "upload"),
        (cs.PinnedStaging, "_owner_buffer"),
        (cs.PinnedStaging, "consumed"),
    ]
    saved = [(obj, name, getattr(obj, name)) for obj, name in targets]
    for obj, name, fn in saved:
        setattr(obj, name, timed(f"{getattr(obj, '__name__', obj)}.{name}", fn))
    try:
        it = iter(range(1 << 30))
        step = timed("step (traced)", lambda: opt.step(0, p, pinned[next(it) % 4]))
        for _ in range(20):
            step()
        spent.clear()
        torch.cuda.synchronize()
        for _ in range(reps):
            step()
        torch.cuda.synchronize()
    finally:
        for obj, name, fn in saved:
            setattr(obj, name, fn)
    return [(f"  traced: {k}", 1e6 * v / reps) for k, v in sorted(spent.items(), key=lambda kv: -kv[1])]


def _order_cut_phases(k: Any, c: Any, xv: Any, reps: int = 30) -> list[tuple[str, float]]:
    """wanrt_order_cut's phases on the device (its PROFILE=1 build: clock64 stamps at the boundaries),
    in µs per selection, through the compressor's own launch."""
    import cupy as cp

    from wanrt.kernels.cupy_source import BLOCKS_SOURCE, compile_options

    mod = cp.RawModule(code=BLOCKS_SOURCE, options=compile_options(BS=1, PROFILE=1))
    stamps = cp.ndarray((8,), cp.int64, mod.get_global("wanrt_prof"))
    khz = cp.cuda.Device().attributes["ClockRate"]
    fkey = ("wanrt_order_cut", ("BS", 1))
    saved = k._functions.get(fkey)
    k._functions[fkey] = mod.get_function("wanrt_order_cut")
    names = ["layout (1)", "radix select (2)", "counts", "trim / out (3)"]
    spent = [0.0] * len(names)
    try:
        for _ in range(5):
            c._select(0, xv, k, None)
        for _ in range(reps):
            stamps.fill(0)
            c._select(0, xv, k, None)
            h = stamps.get()
            for i in range(len(names)):
                spent[i] += (h[i + 1] - h[i]) / khz * 1e3  # cycles / kHz = ms -> µs
    finally:
        if saved is not None:
            k._functions[fkey] = saved
    return [(f"  order_cut: {n}", t / reps) for n, t in zip(names, spent, strict=True)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=25_000_000)
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("skipped: no CUDA device")
        return 0
    import cupy as cp

    from wanrt.kernels import get_kernels, make_compressor, make_sparse_optimizer
    from wanrt.kernels.arrays import as_vector, bump_torch_version, check_block_indices
    from wanrt.payload import n_blocks

    def ck_optim_source() -> str:
        from wanrt.kernels.cupy_source import OPTIM_SOURCE

        return OPTIM_SOURCE

    n, reps = args.elements, args.reps
    nb = n_blocks(n, BLOCK)
    p = torch.randn(n, device="cuda")
    pvec = as_vector(p, writable=True)
    k = get_kernels(pvec)
    updates = [_update(n, s) for s in range(4)]
    staged = _pinned_updates(k, updates)
    assert staged is not None
    pinned, _bufs = staged
    u = pinned[0]
    opt = make_sparse_optimizer("adam", lr=1e-3)
    opt.step(0, p, u)
    st = opt._state[0]
    d_i, d_v = k.upload_update(u.indices, u.values, nb)  # type: ignore[attr-defined]
    stream = cp.cuda.get_current_stream()
    ev = cp.cuda.Event(block=False, disable_timing=True)
    rows: list[tuple[str, float]] = []

    def row(name: str, fn: Callable[[], object]) -> None:
        rows.append((name, _us(fn, reps)))

    it = iter(range(1 << 30))
    row("whole step, pinned update", lambda: opt.step(0, p, pinned[next(it) % 4]))
    row("whole step, pageable update", lambda: opt.step(0, p, updates[next(it) % 4]))
    row("as_vector(torch cuda param)", lambda: as_vector(p, writable=True))
    row("p.detach()", lambda: p.detach())
    row("torch.cuda.current_stream()", lambda: torch.cuda.current_stream(0))
    row("torch._C._cuda_getCurrentRawStream", lambda: torch._C._cuda_getCurrentRawStream(0))
    row("cupy get_current_stream", cp.cuda.get_current_stream)
    row(
        "UnownedMemory+MemoryPointer+ndarray",
        lambda: cp.ndarray(
            (n,),
            dtype=cp.float32,
            memptr=cp.cuda.MemoryPointer(cp.cuda.UnownedMemory(p.data_ptr(), n * 4, p, 0), 0),
        ),
    )
    row("get_kernels", lambda: get_kernels(pvec))
    row("check_block_indices", lambda: check_block_indices(np, u.indices, nb))
    row("upload (pinned) + consumed", lambda: k._staging.consumed(k._staging.upload(u.indices, u.values)[0]))  # type: ignore[attr-defined]
    row("Event()", lambda: cp.cuda.Event(block=False, disable_timing=True))
    row("event.record", lambda: ev.record(stream))
    row("stream.wait_event", lambda: stream.wait_event(ev))
    row("event.synchronize (done)", ev.synchronize)
    host = u.values
    dev = cp.empty(host.nbytes, dtype=cp.uint8)
    row(
        "memcpyAsync 1 MB pinned",
        lambda: cp.cuda.runtime.memcpyAsync(dev.data.ptr, host.ctypes.data, host.nbytes, 1, stream.ptr),
    )
    row("_apply (adam launch, 21 args)", lambda: opt._apply(k, pvec, st, d_i, d_v, BLOCK))
    sgd = make_sparse_optimizer("sgd", lr=1e-3)
    row("_apply (sgd launch, 8 args)", lambda: sgd._apply(k, pvec, None, d_i, d_v, BLOCK))  # type: ignore[arg-type]
    fn_adam = k._function(ck_optim_source(), "wanrt_adam", BS=BLOCK)  # type: ignore[attr-defined]
    bc1, bc2 = opt._bias.upto(8, cp)  # type: ignore[attr-defined]
    a = st.arrays
    f32 = np.float32
    prebuilt = (
        pvec,
        a["exp_avg"],
        a["exp_avg_sq"],
        a["steps"],
        d_i,
        d_v,
        np.int64(d_i.shape[0]),
        np.int64(n),
        bc1,
        bc2,
        np.int64(bc1.shape[0]),
        np.float64(1e-3),
        f32(0.1),
        f32(0.999),
        f32(0.001),
        f32(0),
        f32(1e-8),
        f32(1),
        np.int32(0),
        np.int32(0),
        k._error_flag(),  # type: ignore[attr-defined]
    )
    grid, block = k._grid(int(d_i.shape[0]), BLOCK)  # type: ignore[attr-defined]
    row("adam fn() with prebuilt args (launch only)", lambda: fn_adam(grid, block, prebuilt))
    row("bias.upto", lambda: opt._bias.upto(5, cp))  # type: ignore[attr-defined]
    row("bump_torch_version", lambda: bump_torch_version(p))
    row("np.float32() x10", lambda: [np.float32(1.0) for _ in range(10)])
    x = torch.randn(n, device="cuda")
    c = make_compressor("threshold_v_block", density=DENSITY)
    row("select_device (whole)", lambda: c.select_device(0, x))
    xv = as_vector(x)
    row("select_stats only", lambda: c._select(0, xv, k, None))  # type: ignore[attr-defined]
    small = cp.zeros(5, dtype=cp.float64)
    row("device .get() of 5 floats", small.get)
    row("cp.empty(20000, int64)", lambda: cp.empty(20000, dtype=cp.int64))
    rows.extend(_traced_step(opt, p, pinned, reps))
    rows.extend(_order_cut_phases(k, c, xv))
    width = max(len(r[0]) for r in rows)
    text = "\n".join(f"{name:<{width}}  {us:9.1f} us" for name, us in rows)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
