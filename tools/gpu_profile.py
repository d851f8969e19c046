"""Where the time of wanrt's GPU hot paths goes: host (cProfile) and device (torch's profiler, CUPTI).

``tools/bench_gpu.py`` says how fast each path is against torch; this says why, in one call on a GPU
machine that is lent for minutes: for the selection (threshold-v block, with and without error feedback),
the sparse Adam step from a pageable host update and from the client's pinned buffer, and the leader's
per-layer path, it prints the top host functions by own time, the device's kernels and copies by time, and
(unprofiled) how long the host takes to queue a call against how long the call takes.
``python tools/gpu_profile.py [--elements N] [--out FILE]``; on a machine without CUDA it runs the same
code on the CPU (a smoke test).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from tools.bench_gpu import BLOCK, DENSITY, _pinned_updates, _update


def _profile(name: str, fn: Callable[[], object], reps: int, cuda: bool) -> str:
    for _ in range(5):  # warm-up: compilation, the controller's first steps
        fn()
    if cuda:
        torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(reps):
        fn()
    if cuda:
        torch.cuda.synchronize()
    prof.disable()
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    stats.sort_stats("tottime").print_stats(22)
    host = buf.getvalue()
    dev = ""
    if cuda:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as tp:
            for _ in range(reps):
                fn()
            torch.cuda.synchronize()
        dev = tp.key_averages().table(sort_by="self_cuda_time_total", row_limit=18)
    total = sum(s[2] for s in stats.stats.values())  # type: ignore[attr-defined]
    enqueue, whole = _unprofiled(fn, reps, cuda)
    head = (
        f"######## {name}: {reps} calls, host own time {1e3 * total / reps:.3f} ms per call (cProfile); "
        f"unprofiled: {1e3 * enqueue:.3f} ms per call on the host before the device is waited for, "
        f"{1e3 * whole:.3f} ms per call with it"
    )
    return "\n".join([head, host, dev])


def _unprofiled(fn: Callable[[], object], reps: int, cuda: bool) -> tuple[float, float]:
    """Seconds per call of ``reps`` back-to-back calls: when the host had queued them all (a call that
    reads the device back waits inside it), and when the device had finished them."""
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    t1 = time.perf_counter()
    if cuda:
        torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) / reps, (t2 - t0) / reps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=None)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", help="also write the report here")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    n = args.elements or (25_000_000 if cuda else 1 << 20)

    from wanrt.client import ClientConfig
    from wanrt.client.leader.device_path import DeviceLayerCompressor
    from wanrt.kernels import make_compressor, make_sparse_optimizer

    x = torch.randn(n, device=dev)
    parts = [f"gpu_profile: {n / 1e6:.2f} M fp32 on {dev}, density {DENSITY}, block {BLOCK}"]
    c = make_compressor("threshold_v_block", density=DENSITY)
    parts.append(_profile("select_device threshold_v_block", lambda: c.select_device(0, x), args.reps, cuda))
    c2 = make_compressor("threshold_v_block", density=DENSITY)
    residual = torch.zeros_like(x)
    parts.append(
        _profile("select_device with residual", lambda: c2.select_device(0, x, residual), args.reps, cuda)
    )
    p = torch.randn(n, device=dev)
    opt = make_sparse_optimizer("adam", lr=1e-3)
    updates = [_update(n, s) for s in range(4)]
    it = iter(range(1 << 30))
    parts.append(
        _profile(
            "sparse adam step (pageable host update)",
            lambda: opt.step(0, p, updates[next(it) % 4]),
            args.reps,
            cuda,
        )
    )
    from wanrt.kernels import get_kernels
    from wanrt.kernels.arrays import as_vector

    staged = _pinned_updates(get_kernels(as_vector(p)), updates)
    if staged is not None:
        pinned = staged[0]
        parts.append(
            _profile(
                "sparse adam step (update in the client's pinned buffer)",
                lambda: opt.step(0, p, pinned[next(it) % 4]),
                args.reps,
                cuda,
            )
        )
    leader = DeviceLayerCompressor(ClientConfig(density=DENSITY))

    def one() -> None:
        leader.mark_ready(0, x)
        leader.compress_tensor(0, x, None, 1.0)

    parts.append(_profile("leader compress_tensor", one, args.reps, cuda))
    text = "\n\n".join(parts)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
