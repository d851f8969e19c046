"""The trainer of test_kill_restart_e2e.py, started by torchrun:
``python -m torch.distributed.run --nproc-per-node=1 --max-restarts=1 -m tests.scheduler.service.
kill_restart_trainer --gateway URL --site a --secret-file F --steps N --out DIR [--slow-s 0.2]``.

A bad node replaced by a good one: with ``--slow-s`` every iteration of the first start
(``TORCHELASTIC_RESTART_COUNT == 0``) sleeps that long inside its batch (before ``step()``, so it counts
as batch processing time, as a slow GPU would); the restarted worker group is not slow. Each start writes
``<site><rank>-<restart count>.json``: where it started and ended, why it stopped, the parameter resyncs it
installed, the iterations it pushed empty while its snapshot was pending and a digest of its parameters.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import traceback

import torch

import wanrt
from wanrt.client import ClientConfig, SparseOptimizer

IN, HIDDEN, OUT = 16, 32, 4


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUT))


def batch(site: str, rank: int, step: int, n: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * (ord(site[0]) % 97) + 100_000 * rank + step)
    x = torch.randn(n, IN, generator=g)
    return x, torch.tanh(x[:, :OUT])


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gateway", required=True)
    ap.add_argument("--site", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--secret-file", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--slow-s", type=float, default=0.0)
    ap.add_argument("--slow-rank", type=int, default=0, help="the site rank on the bad node")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    restarts = wanrt.restart_count()
    rank = int(os.environ.get("RANK", "0"))
    slow = args.slow_s if restarts == 0 and rank == args.slow_rank else 0.0
    result: dict[str, object] = {"restart_count": restarts, "pid": os.getpid()}
    out = os.path.join(args.out, f"{args.site}{rank}-{restarts}.json")
    model = make_model()
    ctx = None
    try:
        cfg = ClientConfig(density=0.25, update_deadline_s=60.0, staleness=1)
        ctx = wanrt.init(args.gateway, site=args.site, job=args.job, secret_file=args.secret_file, config=cfg)
        ctx.set_batch_size(16)
        opt = SparseOptimizer(model.named_parameters(), "sgd", lr=0.1, ctx=ctx)
        result["start_iteration"] = ctx.iteration
        result["t_start"] = time.monotonic()  # comparable across this host's processes (CLOCK_MONOTONIC)
        ends: list[float] = []  # when each iteration's step() returned, from start_iteration on
        result["step_ends"] = ends
        while ctx.iteration < args.steps:
            x, y = batch(args.site, rank, ctx.iteration)
            torch.nn.functional.mse_loss(model(x), y).backward()
            if slow:
                time.sleep(slow)
            opt.step()
            opt.zero_grad()
            ends.append(time.monotonic())
            if ctx.resyncs and "t_params" not in result:
                result["t_params"] = ends[-1]  # the job's parameters are in
                result["params_iteration"] = ctx.iteration  # the first iteration trained on them
        ctx.close()
        result.update(ended="done", end_iteration=ctx.iteration, resyncs=ctx.resyncs, digest=digest(model))
        result["discarded_steps"] = ctx.discarded_steps  # pushed empty while the snapshot was pending
        code = 0
    except wanrt.RestartRequested as exc:
        result["t_exit"] = time.monotonic()
        result.update(
            ended="restart", message=str(exc), iteration=exc.fields["iteration"], named=exc.fields["rank"]
        )
        code = 1  # the elastic agent restarts the worker group
    except Exception as exc:
        result.update(ended="error", type=type(exc).__name__, message=traceback.format_exc()[-3000:])
        code = 2
    with open(out, "w") as fh:
        json.dump(result, fh)
    if code == 1:
        raise SystemExit(1)
    return code


if __name__ == "__main__":
    sys.exit(main())
