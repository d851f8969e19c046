"""Where the codec's fused (numba) path starts to pay: the measurement behind ``FUSED_MIN_VALUES``.

Two costs are set side by side in one run:

* per payload: the median wall time of one encode + decode round trip (from bytes, as a receiver gets
  them) of a 5 %-density payload, fused and NumPy reference paths, over payload sizes from 64 value slots
  up, for block-16 and element-wise payloads and fp32 and fp16 on the wire (``tools/bench_codec.py``'s
  timing, over sizes instead of one 25M-element layer);
* once per process: what loading the fused path costs, measured in fresh subprocesses: peak resident
  memory (``VmHWM``) and seconds for "import the codec, encode one small payload" against the same plus
  loading and compiling (or loading from numba's disk cache) every fused codec kernel.

The fused path is faster at every size; what it must pay back is the once-per-process cost. The
threshold rule: per layout, the smallest size at which the reference's round trip has grown to twice its
small-payload floor, i.e. where its cost stops being per-call overhead and starts growing with the
payload; the threshold is the smallest of those over the layouts (the first size where any layout gains
more than its fixed cost), printed beside the constant in ``wanrt/codec/kernel_choice.py``.

    python tools/bench_codec_crossover.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from wanrt.codec import decode_payload, encode_payload  # noqa: E402
from wanrt.codec.kernel_choice import KERNEL_ENV  # noqa: E402
from wanrt.kernel_env import FUSED_MIN_VALUES  # noqa: E402
from wanrt.payload import SparsePayload, n_blocks  # noqa: E402

LAYOUTS = ((16, "fp32"), (16, "fp16"), (1, "fp32"), (1, "fp16"))
DENSITY = 0.05


def make_payload(values: int, block_size: int, seed: int = 0) -> SparsePayload:
    rng = np.random.default_rng(seed)
    count = max(1, values // block_size)
    nb = max(count, round(count / DENSITY))
    idx = np.sort(rng.choice(nb, size=count, replace=False)).astype(np.int64)
    vals = (rng.standard_normal(count * block_size) * 1e-3).astype(np.float32)
    return SparsePayload(0, nb * block_size, block_size, idx, vals)


def median_s(fn: Callable[[], Any], budget_s: float, max_reps: int) -> float:
    fn()
    times: list[float] = []
    t_end = time.perf_counter() + budget_s
    while len(times) < 5 or (len(times) < max_reps and time.perf_counter() < t_end):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def round_trip_s(p: SparsePayload, wire: str, path: str, budget_s: float) -> float:
    def once() -> None:
        meta, bufs = encode_payload(p, wire_dtype=wire)
        decode_payload(meta, [bytes(b) for b in bufs])

    with mock.patch.dict(os.environ, {KERNEL_ENV: path}):
        return median_s(once, budget_s, 400)


def sweep(sizes: list[int], budget_s: float) -> list[dict[str, Any]]:
    rows = []
    for block_size, wire in LAYOUTS:
        for values in sizes:
            p = make_payload(values, block_size)
            ref = round_trip_s(p, wire, "numpy", budget_s)
            fused = round_trip_s(p, wire, "fused", budget_s)
            rows.append(
                {
                    "block_size": block_size,
                    "wire": wire,
                    "values": p.nnz,
                    "n_blocks": n_blocks(p.dense_len, block_size),
                    "numpy_us": ref * 1e6,
                    "fused_us": fused * 1e6,
                    "speedup": ref / fused,
                    "saved_us": (ref - fused) * 1e6,
                }
            )
    return rows


def crossovers(rows: list[dict[str, Any]]) -> dict[str, int | None]:
    """Per layout: the smallest size whose reference round trip is at least twice the floor (the cheapest
    of the three smallest sizes, so that one noisy first reading cannot set it)."""
    out: dict[str, int | None] = {}
    for block_size, wire in LAYOUTS:
        mine = [r for r in rows if r["block_size"] == block_size and r["wire"] == wire]
        floor = min(r["numpy_us"] for r in mine[:3])
        layout = f"block{block_size}-{wire}"
        out[layout] = next((r["values"] for r in mine if r["numpy_us"] >= 2 * floor), None)
    return out


_PROBE = """
import json, os, sys, time
t0 = time.perf_counter()
import numpy as np
from wanrt.codec import decode_payload, encode_payload
from wanrt.payload import SparsePayload
p = SparsePayload.from_dense_blocks(0, np.ones(4096, np.float32), np.array([0, 3, 200]), 16)
meta, bufs = encode_payload(p, wire_dtype="fp16")
decode_payload(meta, [bytes(b) for b in bufs])
if sys.argv[1] == "fused":
    from wanrt.codec.kernel_choice import fused_loader
    assert fused_loader().wait(600) is not None, fused_loader().error
seconds = time.perf_counter() - t0
with open("/proc/self/status") as fh:
    hwm = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))
print(json.dumps({"seconds": seconds, "peak_rss_mb": hwm / 1024, "numba": "numba" in sys.modules}))
"""


def load_cost(reps: int) -> dict[str, Any]:
    """Fresh processes: the codec alone vs the codec plus the loaded fused kernels (disk cache warm)."""
    env = {k: v for k, v in os.environ.items() if k != KERNEL_ENV}
    env["PYTHONPATH"] = str(REPO)
    out: dict[str, Any] = {}
    for variant in ("numpy", "fused") * reps:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE, variant],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=900,
        )
        out.setdefault(variant, []).append(json.loads(done.stdout))
    summary = {
        v: {
            "seconds": statistics.median(r["seconds"] for r in runs),
            "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in runs),
            "numba_imported": runs[0]["numba"],
        }
        for v, runs in out.items()
    }
    summary["fused_extra_rss_mb"] = summary["fused"]["peak_rss_mb"] - summary["numpy"]["peak_rss_mb"]
    summary["fused_extra_s"] = summary["fused"]["seconds"] - summary["numpy"]["seconds"]
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer sizes and repetitions (under a minute)")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)
    top = 1 << 18 if args.quick else 1 << 20
    sizes = [1 << k for k in range(6, top.bit_length())]
    budget = 0.1 if args.quick else 0.5
    load = load_cost(1 if args.quick else 2)
    rows = sweep(sizes, budget)
    cross = crossovers(rows)
    found = [v for v in cross.values() if v is not None]
    measured = min(found) if found else None
    print(f"{'layout':16} {'values':>8} {'numpy us':>9} {'fused us':>9} {'speedup':>8} {'saved us':>9}")
    for r in rows:
        layout = f"block{r['block_size']}-{r['wire']}"
        print(
            f"{layout:16} {r['values']:8d} {r['numpy_us']:9.1f} {r['fused_us']:9.1f} "
            f"{r['speedup']:8.2f} {r['saved_us']:9.1f}"
        )
    print("\nreference round trip reaches 2x its floor at (values):")
    for layout, v in cross.items():
        print(f"  {layout:16} {v}")
    print(
        f"\nonce per process (fresh subprocess, disk cache warm): codec alone "
        f"{load['numpy']['peak_rss_mb']:.1f} MB / {load['numpy']['seconds']:.2f} s, with the fused kernels "
        f"{load['fused']['peak_rss_mb']:.1f} MB / {load['fused']['seconds']:.2f} s "
        f"(+{load['fused_extra_rss_mb']:.1f} MB, +{load['fused_extra_s']:.2f} s)"
    )
    print(f"\nfused_min_values_measured = {measured}   FUSED_MIN_VALUES in code = {FUSED_MIN_VALUES}")
    if args.json:
        out = {
            "rows": rows,
            "crossovers": cross,
            "load": load,
            "fused_min_values_measured": measured,
            "fused_min_values_constant": FUSED_MIN_VALUES,
            "fused_extra_rss_mb": load["fused_extra_rss_mb"],
            "fused_extra_s": load["fused_extra_s"],
        }
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
