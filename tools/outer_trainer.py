"""A DiLoCo trainer written from docs/outer_loop.md, for the outer loop's process tests (and benches).

Like :mod:`tools.real_trainer` (the same model, text and batches; launched as a process per site by
:class:`tools.real_job.RealJob`, killed with SIGKILL and launched again with the same command), but the
loop is ``wanrt.DiLoCo`` around ``torch.optim.AdamW``: ``--sync-every`` H inner steps per fragment's
outer step, ``--fragments`` P (Streaming DiLoCo) with ``--mixing`` α.
After every outer step it appends one JSON line to ``--log``: the outer step (``ctx.iteration``), a
digest of the job's parameters (the anchors) and one of the model's (the local copy), the held-out
loss, the resyncs installed and whether that round's push was left out (its parameters were not yet the
job's). ``--out`` gets the final digest.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # `python tools/outer_trainer.py` from the worktree root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

import wanrt
from tools.real_trainer import batch, build_model, digest, tensors_digest, text
from wanrt.client import ClientConfig


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--site", required=True)
    ap.add_argument("--gateway", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--secret-file", required=True)
    ap.add_argument("--outer-steps", type=int, default=40)
    ap.add_argument("--sync-every", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--outer-lr", type=float, default=0.7)
    ap.add_argument("--outer-momentum", type=float, default=0.9)
    ap.add_argument("--fragments", type=int, default=1, help="Streaming DiLoCo's P")
    ap.add_argument("--mixing", type=float, default=0.0, help="Streaming DiLoCo's α")
    ap.add_argument("--density", type=float, default=0.25)
    ap.add_argument("--wire-dtype", default="fp32")
    ap.add_argument("--staleness", type=int, default=0)
    ap.add_argument("--compute-s", type=float, default=0.0, help="extra pause per inner step")
    ap.add_argument("--deadline-s", type=float, default=120.0)
    ap.add_argument("--log", type=Path, help="one JSON line per outer step")
    ap.add_argument("--out", type=Path, help="final digest and counters (JSON)")
    args = ap.parse_args(argv)

    config = ClientConfig(
        density=args.density,
        staleness=args.staleness,
        wire_dtype=args.wire_dtype,
        update_deadline_s=args.deadline_s,
    )
    ctx = wanrt.init(args.gateway, secret_file=args.secret_file, site=args.site, job=args.job, config=config)
    model = build_model()
    inner = torch.optim.AdamW(model.parameters(), lr=args.lr)
    opt = wanrt.DiLoCo(
        model,
        inner,
        ctx=ctx,
        sync_every=args.sync_every,
        outer_lr=args.outer_lr,
        outer_momentum=args.outer_momentum,
        fragments=args.fragments,
        mixing=args.mixing,
    )
    ctx.set_batch_size(args.batch)
    data = text()
    ex, ey = batch(data, "eval", 0, 0, 256)
    log = args.log.open("a") if args.log is not None else None
    first = ctx.iteration
    while ctx.iteration < args.outer_steps:
        outer = ctx.iteration
        x, y = batch(data, args.site, ctx.rank, outer * 1000 + opt.inner_steps_done, args.batch)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if args.compute_s:
            time.sleep(args.compute_s)  # stands for a larger model's compute
        if ctx.iteration != outer and log is not None:  # an outer step ended: the job's parameters
            with torch.no_grad():
                held_out = float(torch.nn.functional.cross_entropy(model(ex), ey))
            rec = {
                "t": time.time(),
                "it": ctx.iteration,
                "digest": tensors_digest(opt.anchor),  # the job's parameters
                "model": digest(model),  # the local copy (differs between sites while updates fly)
                "eval": round(held_out, 5),
                "discarded": ctx.last_step_discarded,
                "resyncs": ctx.resyncs,
                "pid": os.getpid(),
            }
            log.write(json.dumps(rec) + "\n")
            log.flush()
    opt.close()
    if args.out is not None:
        result = {
            "site": args.site,
            "first_iteration": first,
            "iteration": ctx.iteration,
            "digest": digest(model),
            "resyncs": ctx.resyncs,
            "discarded_steps": ctx.discarded_steps,
        }
        args.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
