"""Per-step cost of the wanrt trainer client, side by side with a plain torch optimizer, in one run.

One site, one rank, in this process, against the fake gateway of the test suite (real protocol over a unix
socket), so what is measured is the client's own overhead: hooks, compression, framing, the round trip
through a local gateway, the site broadcast and the sparse apply. Columns: a plain ``torch.optim.SGD``
step (no communication: the floor), the wanrt dense baseline (what DDP would send) and the sparse path at
the given density, plus the values each sends per step. Timings are noisy on a shared machine: read the
ratios. ``--quick`` keeps it under a minute; ``--json PATH`` writes the table.

    python tools/bench_client.py --quick --json /tmp/bench_client.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--width", type=int, default=1024, help="hidden width of the 3-layer MLP")
    ap.add_argument("--density", type=float, default=0.01)
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    import torch
    import torch.distributed as dist

    import wanrt
    from tools.harness.fake_gateway import FakeGateway, run_in_thread
    from wanrt.client import ClientConfig, SparseOptimizer

    steps, warmup = (30, 5) if args.quick else (200, 20)
    w = args.width
    tmp = Path(tempfile.mkdtemp(prefix="wanrt-bench-"))
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
    secret = os.urandom(32)

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Linear(256, w),
            torch.nn.ReLU(),
            torch.nn.Linear(w, w),
            torch.nn.ReLU(),
            torch.nn.Linear(w, 10),
        )

    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))

    def timed(step: object) -> float:
        for i in range(warmup + steps):
            if i == warmup:
                t0 = time.perf_counter()
            step()  # type: ignore[operator]
        return (time.perf_counter() - t0) / steps

    rows = []
    m = model()
    sgd = torch.optim.SGD(m.parameters(), lr=0.01)

    def torch_step() -> None:
        torch.nn.functional.cross_entropy(m(x), y).backward()
        sgd.step()
        sgd.zero_grad()

    n_params = sum(p.numel() for p in m.parameters())
    rows.append(
        {"mode": "torch.optim.SGD (no comm)", "ms_per_step": 1e3 * timed(torch_step), "values_sent": 0}
    )
    for name, cfg in (
        ("wanrt dense baseline", ClientConfig.dense_baseline()),
        (f"wanrt sparse d={args.density}", ClientConfig(density=args.density, staleness=0)),
    ):
        gw = FakeGateway(f"unix://{tmp}/{len(rows)}.sock", sites=("a",), job="bench", secret=secret)
        with run_in_thread(gw):
            ctx = wanrt.init(gw.url, site="a", job="bench", secret=secret, config=cfg)
            mm = model()
            opt = SparseOptimizer(mm.named_parameters(), "sgd", lr=0.01, ctx=ctx)

            def wanrt_step(mm: torch.nn.Module = mm, opt: SparseOptimizer = opt) -> None:
                torch.nn.functional.cross_entropy(mm(x), y).backward()
                opt.step()
                opt.zero_grad()

            ms = 1e3 * timed(wanrt_step)
            ctx.close()
        rows.append({"mode": name, "ms_per_step": ms, "values_sent": gw.elements / (warmup + steps)})
    dist.destroy_process_group()
    base = rows[0]["ms_per_step"]
    dense = rows[1]["ms_per_step"]
    path = os.environ.get("WANRT_KERNELS", "auto")
    print(f"model: {n_params} parameters, batch 64, {steps} timed steps (WANRT_KERNELS={path})")
    print(f"{'mode':<28} {'ms/step':>9} {'x torch':>8} {'x dense':>8} {'values/step':>12}")
    for r in rows:
        r["vs_torch"] = r["ms_per_step"] / base
        r["vs_dense"] = r["ms_per_step"] / dense
        cols = f"{r['ms_per_step']:9.2f} {r['vs_torch']:8.2f} {r['vs_dense']:8.2f} {r['values_sent']:12.0f}"
        print(f"{r['mode']:<28} {cols}")
    if args.json:
        args.json.write_text(json.dumps({"params": n_params, "steps": steps, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
