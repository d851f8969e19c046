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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import torch

from tools.bench_gpu import BLOCK, DENSITY, _pinned_updates, _update


def _us(fn: Callable[[], object], reps: int) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return 1e6 * (t1 - t0) / reps


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
    width = max(len(r[0]) for r in rows)
    text = "\n".join(f"{name:<{width}}  {us:9.1f} us" for name, us in rows)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
