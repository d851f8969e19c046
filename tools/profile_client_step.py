"""Where one wanrt iteration's time goes on the trainer side: spans around every stage, beside compute only.

One site, one rank (the leader), the demo's MLP (``--hidden``, default 3200: bench_e2e's 10.5 M-parameter
timing model), batch 32, torch on one thread like the demo's trainers, against the test suite's fake
gateway in *another process* (real protocol over a unix socket; it sums and returns each push at once), so
the time measured is the trainer's own: hooks, the worker's compress + push, the wait in ``step()``, the
decode and the sparse apply. Each stage is timed with ``perf_counter`` (wall) and ``thread_time`` (CPU of
the thread that ran it) by wrapping the client's own methods; the compute-only run (``torch.optim.SGD``,
no wanrt) is timed in the same process, before and after, to bracket load drift.

    python tools/profile_client_step.py [--quick] [--hidden 3200] [--json PATH] [--cprofile]
    python tools/profile_client_step.py --flat 5000000 --density 0.01 --staleness 0

``--flat N``: instead of the MLP, ``tools/bench_round.py --client``'s model (one fp32 parameter of N
elements, ``loss = <w, g>`` with a fixed standard-normal ``g``: backward is autograd's minimal work), so the
trainer's share of that bench's client rows is measured alone, without the other sites' processes on the
same cores. The rows then also give each thread's CPU per iteration (``/proc`` schedstat: the training
thread, the leader's worker, the link's event loop), the split that says what a round costs the cores.

``--quick`` (< 60 s): fewer iterations. ``--cprofile``: also a cProfile of the training thread and of the
leader's worker thread (top functions by cumulative time).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


class Spans:
    """Wall and thread-CPU seconds per named stage, summed over the timed iterations."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self.on = False

    def wrap(self, obj: Any, name: str, label: str) -> None:
        fn = getattr(obj, name)

        def timed(*a: Any, **kw: Any) -> Any:
            if not self.on:
                return fn(*a, **kw)
            w0, c0 = time.perf_counter(), time.thread_time()
            try:
                return fn(*a, **kw)
            finally:
                self.wall[label] += time.perf_counter() - w0
                self.cpu[label] += time.thread_time() - c0

        setattr(obj, name, timed)


@contextlib.contextmanager
def fake_gateway(tmp: Path, secret_file: Path) -> Iterator[str]:
    url = f"unix://{tmp}/gw.sock"
    cmd = [sys.executable, "-m", "tools.harness.fake_gateway", "--url", url, "--sites", "a"]
    cmd += ["--job", "prof", "--secret-file", str(secret_file)]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        proc.stdout.readline()  # "listening on ..."
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def thread_cpu() -> dict[str, float]:
    """CPU seconds so far of each of this process's threads (``/proc/self/task/*/schedstat``, ns resolution),
    by Python thread name where Python knows it, else the OS's (torch's and gloo's own threads); threads of
    one name are summed."""
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = defaultdict(float)
    for tid in os.listdir("/proc/self/task"):
        try:
            name = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
            ns = int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):  # the thread ended meanwhile
            continue
        py = names.get(int(tid))
        out["training thread" if int(tid) == os.getpid() else (py or name).rstrip("_0123456789")] += ns / 1e9
    return dict(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--hidden", type=int, default=3200)
    ap.add_argument("--flat", type=int, help="one fp32 parameter of this many elements (bench_round's model)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--density", type=float, default=0.02)
    ap.add_argument("--staleness", type=int, default=1)
    ap.add_argument("--steps", type=int, help="timed iterations (default 40, 12 with --quick)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--cprofile", action="store_true")
    ap.add_argument("--switch-interval", type=float, help="sys.setswitchinterval (GIL hand-over), seconds")
    args = ap.parse_args()
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)

    import torch
    import torch.distributed as dist

    import wanrt
    from wanrt.client import ClientConfig, SparseOptimizer
    from wanrt.client.context import Context
    from wanrt.client.leader.compression import LayerCompressor
    from wanrt.client.leader.push_path import LeaderPush
    from wanrt.demo.trainers.training_loop import warm_up
    from wanrt.demo.workload.model import build_mlp

    torch.set_num_threads(1)
    warmup, steps = (3, 12) if args.quick else (5, 40)
    steps = args.steps or steps
    tmp = Path(tempfile.mkdtemp(prefix="wanrt-prof-"))
    secret_file = tmp / "job.key"
    secret_file.write_bytes(os.urandom(32).hex().encode())
    secret_file.chmod(0o600)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
    warm_up("sgd", 0.3)
    from wanrt.demo.workload import data as demo_data

    split = demo_data.load_split(0)

    def sampler() -> Any:
        return demo_data.Sampler(split, index=0, world=1, batch=args.batch, seed=0)

    def timed(step: Callable[[], None]) -> tuple[float, float]:
        for _ in range(warmup):
            step()
        w0, c0 = time.perf_counter(), time.process_time()
        for _ in range(steps):
            step()
        return (time.perf_counter() - w0) / steps, (time.process_time() - c0) / steps

    flat_g = torch.randn(args.flat or 1, generator=torch.Generator().manual_seed(7))

    def build() -> torch.nn.Module:
        if args.flat is None:
            return build_mlp(args.hidden, 0)
        m = torch.nn.Module()
        m.w = torch.nn.Parameter(torch.zeros(args.flat))
        return m

    def loss_of(m: torch.nn.Module, draw: Any) -> torch.Tensor:
        if args.flat is not None:
            return torch.dot(m.get_parameter("w"), flat_g)
        x, y = draw.next()
        return torch.nn.functional.cross_entropy(m(x), y)

    def local_run() -> tuple[float, float]:
        m = build()
        sgd = torch.optim.SGD(m.parameters(), lr=0.3)
        draw = sampler()

        def step() -> None:
            loss_of(m, draw).backward()
            sgd.step()
            sgd.zero_grad()

        return timed(step)

    local_before = local_run()
    spans = Spans()
    spans.wrap(LeaderPush, "compress_and_push", "worker: wait reduce + compress + push (total)")
    spans.wrap(LayerCompressor, "compress", "worker: compress (EF + select + gather)")
    spans.wrap(Context, "_exchange", "step: drain worker + wait + decide + broadcast")
    spans.wrap(Context, "_apply", "step: apply (average + sparse optimizer)")
    spans.wrap(Context, "_report", "step: telemetry")
    from wanrt.client.link import gateway_link as gl

    spans.wrap(gl.GatewayLink, "push", "worker: link.push (wire cast + enqueue)")
    profs: dict[str, cProfile.Profile] = {}
    if args.cprofile:
        import threading

        wprof = profs["leader worker thread"] = cProfile.Profile()
        orig = LeaderPush.compress_and_push

        def profiled(self: Any, *a: Any) -> None:
            assert threading.current_thread().name.startswith("wanrt-leader")
            if not spans.on:
                return orig(self, *a)
            wprof.enable()
            try:
                orig(self, *a)
            finally:
                wprof.disable()

        LeaderPush.compress_and_push = profiled  # type: ignore[method-assign]
    cfg = ClientConfig(density=args.density, staleness=args.staleness)
    with fake_gateway(tmp, secret_file) as url:
        ctx = wanrt.init(url, site="a", job="prof", secret_file=str(secret_file), config=cfg)
        m = build()
        opt = SparseOptimizer(m.named_parameters(), "sgd", lr=0.3, ctx=ctx)
        fwd = {"t": 0.0}
        draw = sampler()

        def step() -> None:
            t0 = time.perf_counter()
            loss = loss_of(m, draw)
            loss.backward()
            fwd["t"] += time.perf_counter() - t0
            t1 = time.perf_counter()
            opt.step()
            fwd["step"] = fwd.get("step", 0.0) + time.perf_counter() - t1
            opt.zero_grad()

        for _ in range(warmup):
            step()
        fwd.clear()
        fwd["t"] = 0.0
        spans.on = True
        if args.cprofile:
            prof = profs["training thread"] = cProfile.Profile()
            prof.enable()
        w0, c0, t0 = time.perf_counter(), time.process_time(), thread_cpu()
        for _ in range(steps):
            step()
        wanrt_wall, wanrt_cpu = (time.perf_counter() - w0) / steps, (time.process_time() - c0) / steps
        per_thread = {k: (v - t0.get(k, 0.0)) / steps for k, v in thread_cpu().items()}
        if args.cprofile:
            profs["training thread"].disable()
        spans.on = False
        comp = ctx._compressor._compressor if ctx._compressor is not None else None
        exact = [comp.exact_steps(i) for i in range(len(opt.params))] if hasattr(comp, "exact_steps") else []
        ctx.close()
    local_after = local_run()
    dist.destroy_process_group()
    local_wall = min(local_before[0], local_after[0])
    rows = [
        ("compute only (torch.optim.SGD), before", local_before[0], local_before[1]),
        ("compute only (torch.optim.SGD), after", local_after[0], local_after[1]),
        ("wanrt iteration (process CPU)", wanrt_wall, wanrt_cpu),
        ("  forward + backward (incl. hooks)", fwd["t"] / steps, float("nan")),
        ("  opt.step()", fwd.get("step", 0.0) / steps, float("nan")),
    ]
    rows += [(f"  {k}", spans.wall[k] / steps, spans.cpu[k] / steps) for k in spans.wall]
    rows += [(f"  thread {k}", float("nan"), v) for k, v in sorted(per_thread.items(), key=lambda kv: -kv[1])]
    model = "flat" if args.flat is not None else f"MLP hidden {args.hidden}"
    print(
        f"{model} ({sum(p.numel() for p in m.parameters()) / 1e6:.2f} M parameters), batch "
        f"{args.batch}, density {args.density}, staleness {args.staleness}, {steps} timed iterations, "
        f"load {os.getloadavg()[0]:.1f}, WANRT_KERNELS={os.environ.get('WANRT_KERNELS', 'auto')}"
    )
    print(f"{'stage':<58} {'wall ms/it':>10} {'cpu ms/it':>10}")
    for name, w, c in rows:
        print(f"{name:<58} {1e3 * w:10.2f} {1e3 * c:10.2f}")
    print(f"overhead ratio wanrt / compute only: {wanrt_wall / local_wall:.2f}")
    print(f"exact (second-pass) selections over all layers and {warmup + steps} iterations: {exact}")
    for name, prof in profs.items():
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(25)
        print(f"\n--- cProfile: {name} ---\n" + s.getvalue())
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "rows": [{"stage": n, "wall_ms": 1e3 * w, "cpu_ms": 1e3 * c} for n, w, c in rows],
                    "overhead_ratio": wanrt_wall / local_wall,
                    "load": os.getloadavg()[0],
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
