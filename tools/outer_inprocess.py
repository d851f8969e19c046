"""The outer loop's modes side by side in one process: bytes per exchange and held-out loss.

Two sites over the in-memory hub that sums as the gateways do (tools/harness/summing_hub.py; no
daemons, no emulated link: tools/bench_outer.py measures time to target on real daemons), the model,
text and batches of tools/real_trainer.py, the same number of inner steps per site in every mode.
Bytes are what the codec encodes for site a's pushes (values and index, no frame headers). Prints a table
and writes ``--json``. ``--quick`` runs fewer inner steps and reports the same keys.

``python tools/outer_inprocess.py --steps 400 --json out.json``
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python tools/outer_inprocess.py` from the worktree root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
import torch.distributed as dist

import wanrt
from tools.harness.summing_hub import Hub
from tools.real_trainer import batch, build_model, text
from wanrt.client import ClientConfig
from wanrt.codec.payload_codec import encode_payload

MODES: list[tuple[str, ClientConfig, dict[str, Any] | None]] = [
    ("per-step dense fp32", ClientConfig.dense_baseline(staleness=0), None),
    ("per-step 1% fp32", ClientConfig(density=0.01, staleness=0), None),
    ("DiLoCo H=8 dense fp32", ClientConfig.dense_baseline(staleness=0), {"sync_every": 8}),
    ("DiLoCo H=8 5% int4", ClientConfig(density=0.05, staleness=0, wire_dtype="int4"), {"sync_every": 8}),
    ("DiLoCo H=32 5% int4", ClientConfig(density=0.05, staleness=0, wire_dtype="int4"), {"sync_every": 32}),
    (
        "Streaming H=8 P=2 5% int4 s=1 α=0.5",
        ClientConfig(density=0.05, staleness=1, wire_dtype="int4"),
        {"sync_every": 8, "fragments": 2, "mixing": 0.5},
    ),
]


def run(
    name: str, cfg: ClientConfig, outer: dict[str, Any] | None, steps: int, secret: Path
) -> dict[str, Any]:
    hub = Hub(("a", "b"))
    data = text()
    models: dict[str, torch.nn.Module] = {}
    opts: dict[str, Any] = {}
    ctxs: dict[str, wanrt.Context] = {}
    for s in hub.sites:
        ctx = wanrt.client.init(
            "mem://hub", site=s, job="j", secret_file=secret, config=cfg, link_factory=hub.link
        )
        m = build_model()
        if outer is None:  # today's per-step exchange: Adam applied by the sparse kernel at every site
            opts[s] = wanrt.SparseOptimizer(m.named_parameters(), "adam", lr=3e-3, ctx=ctx)
        else:
            opts[s] = wanrt.DiLoCo(m, torch.optim.AdamW(m.parameters(), lr=3e-3), ctx=ctx, **outer)
        models[s], ctxs[s] = m, ctx

    def body(s: str) -> None:
        for t in range(steps):
            x, y = batch(data, s, 0, t, 32)
            torch.nn.functional.cross_entropy(models[s](x), y).backward()
            opts[s].step()
            opts[s].zero_grad()
        ctxs[s].close()

    t0 = time.monotonic()
    threads = [threading.Thread(target=body, args=(s,)) for s in hub.sites]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.monotonic() - t0
    nbytes = sum(
        sum(len(b) for b in encode_payload(p, wire_dtype=cfg.wire_dtype)[1])
        for (site, _, _), p in hub.pushes.items()
        if site == "a"
    )
    ex, ey = batch(data, "eval", 0, 0, 512)
    with torch.no_grad():
        loss = float(torch.nn.functional.cross_entropy(models["a"](ex), ey))
    rounds = ctxs["a"].iteration
    return {
        "mode": name,
        "exchanges": rounds,
        "bytes": nbytes,
        "bytes_per_exchange": nbytes / max(rounds, 1),
        "held_out_loss": loss,
        "sites_equal_at_end": all(
            torch.equal(pa, pb)
            for pa, pb in zip(models["a"].parameters(), models["b"].parameters(), strict=True)
        ),
        "wall_s": wall,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400, help="inner steps per site")
    ap.add_argument("--quick", action="store_true", help="100 inner steps (the same keys)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    steps = 100 if args.quick else args.steps
    with tempfile.TemporaryDirectory() as tmp:
        secret = Path(tmp) / "job.key"
        secret.write_bytes(b"0123456789abcdef-outer-inprocess\n")
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            rows = [run(name, cfg, outer, steps, secret) for name, cfg, outer in MODES]
        finally:
            dist.destroy_process_group()
    with torch.no_grad():
        data = text()
        ex, ey = batch(data, "eval", 0, 0, 512)
        initial = float(torch.nn.functional.cross_entropy(build_model()(ex), ey))
    dense = rows[0]["bytes"]
    for r in rows:
        r["bytes_vs_dense_per_step"] = dense / r["bytes"]
    print(f"{steps} inner steps per site, 2 sites; held-out loss at the start {initial:.4f}")
    head = ("mode", "exch.", "bytes", "B/exch.", "dense/x", "loss", "equal")
    print("{:38s} {:>5s} {:>10s} {:>8s} {:>8s} {:>7s} {:>5s}".format(*head))
    for r in rows:
        print(
            f"{r['mode']:38s} {r['exchanges']:5d} {r['bytes']:10d} {r['bytes_per_exchange']:8.0f} "
            f"{r['bytes_vs_dense_per_step']:8.1f} {r['held_out_loss']:7.4f} {r['sites_equal_at_end']!s:>5s}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps({"steps": steps, "initial_loss": initial, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
