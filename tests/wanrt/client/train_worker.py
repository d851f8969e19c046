"""The trainers of the end-to-end tests: ``python -m tests.wanrt.client.train_worker --sites a,b ...``.

Every (site, rank) runs in its own process with torchrun's environment (MASTER_ADDR/PORT per site, RANK,
WORLD_SIZE), trains the same small regression model with the dense baseline and then with the sparse path,
each against its own gateway, and writes the final evaluation losses and a digest of its final parameters
as JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import socket
import sys
import time
import traceback

import torch

import wanrt
from wanrt.client import ClientConfig, SparseOptimizer

IN, HIDDEN, OUT = 32, 64, 8


def make_model(seed: int = 0, wide: bool = False) -> torch.nn.Module:
    torch.manual_seed(seed)
    hidden = HIDDEN + (8 if wide else 0)
    return torch.nn.Sequential(torch.nn.Linear(IN, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, OUT))


def teacher() -> torch.Tensor:
    return torch.randn(IN, OUT, generator=torch.Generator().manual_seed(1234)) / IN**0.5


def batch(shard: int, step: int, n: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(10_000 * shard + step)
    x = torch.randn(n, IN, generator=g)
    y = torch.tanh(x @ teacher()) + 0.05 * torch.randn(n, OUT, generator=g)
    return x, y


def eval_loss(model: torch.nn.Module) -> float:
    x, y = batch(shard=999, step=0, n=512)
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(model(x), y))


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def train(args: argparse.Namespace, gateway: str, config: ClientConfig) -> dict[str, object]:
    t0 = time.monotonic()
    ctx = wanrt.init(gateway, site=args.site, job="e2e", secret_file=args.secret_file, config=config)
    model = make_model(wide=args.wide)
    opt = SparseOptimizer(model.named_parameters(), args.optimizer, lr=args.lr, ctx=ctx)
    shard = args.site_index * args.world + args.rank
    for step in range(args.steps):
        x, y = batch(shard, step)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    ctx.close()
    return {
        "loss": eval_loss(model),
        "digest": digest(model),
        "initial": eval_loss(make_model()),
        "seconds": time.monotonic() - t0,  # diagnostics only: tests never assert on timing
    }


def run_rank(args: argparse.Namespace, site_index: int, rank: int, port: int) -> None:
    """Body of one forked trainer: torchrun's environment, then the dense and/or sparse run."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(args.world)
    )
    args.site = args.sites[site_index]
    args.site_index, args.rank = site_index, rank
    args.wide = f"{args.site}:{rank}" in args.wide_ranks
    result: dict[str, object] = {}
    try:
        if args.dense_gateway:
            result["dense"] = train(
                args, args.dense_gateway, ClientConfig.dense_baseline(update_deadline_s=30.0)
            )
        if args.sparse_gateway:
            cfg = ClientConfig(density=args.density, update_deadline_s=30.0)
            result["sparse"] = train(args, args.sparse_gateway, cfg)
    except wanrt.WanrtError as exc:
        result["error"] = {"type": type(exc).__name__, "message": str(exc)}
    except Exception:
        result["error"] = {"type": "crash", "message": traceback.format_exc()}
    with open(os.path.join(args.out, f"{args.site}{rank}.json"), "w") as fh:
        json.dump(result, fh)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    """Import torch once, then fork every (site, rank): four cold torch imports on a busy 2-core machine
    take far longer than the training itself."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--sites", type=lambda v: v.split(","), required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--secret-file", required=True)
    ap.add_argument("--dense-gateway")
    ap.add_argument("--sparse-gateway")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--optimizer", default="sgd")
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--density", type=float, default=0.1)
    ap.add_argument("--wide-ranks", default="", help="site:rank,... that build a different model")
    ap.add_argument("--out", required=True, help="directory for <site><rank>.json")
    args = ap.parse_args()
    ctx = multiprocessing.get_context("fork")
    procs = []
    for si in range(len(args.sites)):
        port = free_port()
        for rank in range(args.world):
            p = ctx.Process(target=run_rank, args=(args, si, rank, port))
            p.start()
            procs.append(p)
    for p in procs:
        p.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
