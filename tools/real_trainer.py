"""A trainer written from docs/client.md, for the real-client chaos soak and the checkpoint tests.

Why its own module: ``tools/chaos_soak.py --real-clients`` and tests/tools launch it as a process per
site (``python -m tools.real_trainer``), kill it with SIGKILL and launch it again with the same command,
exactly as a user's ``torchrun`` restart would; nothing here reaches into wanrt's internals. The model is a
small character-level MLP language model with Adam (the public client: ``wanrt.init``,
``wanrt.SparseOptimizer``), each site reading its own shard of a fixed synthetic text.

Every iteration appends one JSON line to ``--log`` (wall time, iteration, the batch's loss, the loss on a
fixed held-out batch, whether its gradients were left out, resyncs installed), so the soak measures from
the trainer's own records when a restarted site contributes again and how the loss moved. At the end it
writes ``--out`` with a digest of the parameters (every site of a job must end with the same digest).
``--save-at N --checkpoint PATH`` stops at iteration N (``ctx.close()``, which applies every outstanding
update) and saves ``model.state_dict()`` and ``opt.state_dict()``;
``--resume PATH`` loads them before training (docs/client.md, *Checkpoint and resume*).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path

if __package__ in (None, ""):  # `python tools/real_trainer.py` from the worktree root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

import wanrt
from wanrt.client import ClientConfig

VOCAB = 32
CONTEXT = 8


def build_model(extra_layer: bool = False) -> torch.nn.Module:
    """The same model at every site (seeded): embedding, two hidden layers, next-character logits."""
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = [
        torch.nn.Embedding(VOCAB, 16),
        torch.nn.Flatten(),
        torch.nn.Linear(16 * CONTEXT, 64),
        torch.nn.Tanh(),
    ]
    if extra_layer:  # the model-mismatch mistake: one layer more at one site
        layers += [torch.nn.Linear(64, 64), torch.nn.Tanh()]
    layers.append(torch.nn.Linear(64, VOCAB))
    return torch.nn.Sequential(*layers)


def text(n: int = 20000) -> torch.Tensor:
    """A fixed, learnable character stream: a noisy periodic pattern (the same at every site)."""
    g = torch.Generator().manual_seed(7)
    base = torch.arange(n) % 23
    noise = torch.randint(0, VOCAB, (n,), generator=g)
    keep = torch.rand(n, generator=g) < 0.9
    return torch.where(keep, base, noise)


def batch(data: torch.Tensor, site: str, rank: int, iteration: int, size: int) -> tuple[torch.Tensor, ...]:
    """This site's and rank's batch of one iteration: a function of the iteration alone, so a restarted
    trainer (or a resumed run) sees the very batches an uninterrupted one would."""
    g = torch.Generator().manual_seed(100_000 * ord(site[0]) + 1000 * rank + iteration)
    starts = torch.randint(0, data.numel() - CONTEXT - 1, (size,), generator=g)
    idx = starts[:, None] + torch.arange(CONTEXT)[None, :]
    return data[idx], data[starts + CONTEXT]


def tensors_digest(tensors: Iterable[torch.Tensor]) -> str:
    """BLAKE2b-128 of the tensors' fp32 bytes in order: equal at two sites only if every value is."""
    h = hashlib.blake2b(digest_size=16)
    for t in tensors:
        h.update(t.detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def digest(model: torch.nn.Module) -> str:
    return tensors_digest(p for _, p in sorted(model.state_dict().items()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--site", required=True)
    ap.add_argument("--gateway", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--secret-file", required=True)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--density", type=float, default=0.25)
    ap.add_argument("--compute-s", type=float, default=0.0, help="extra pause per iteration")
    ap.add_argument("--log", type=Path, help="one JSON line per iteration")
    ap.add_argument("--out", type=Path, help="final digest and counters (JSON)")
    ap.add_argument("--checkpoint", type=Path)
    ap.add_argument("--save-at", type=int, default=-1, help="save after this iteration, close and stop")
    ap.add_argument("--resume", type=Path, help="load model and optimizer state from this checkpoint")
    ap.add_argument("--extra-layer", action="store_true")
    ap.add_argument("--deadline-s", type=float, default=120.0)
    ap.add_argument("--staleness", type=int, default=1)
    args = ap.parse_args(argv)

    config = ClientConfig(density=args.density, staleness=args.staleness, update_deadline_s=args.deadline_s)
    ckpt = torch.load(args.resume, weights_only=False) if args.resume is not None else None
    t0 = time.time()
    ctx = wanrt.init(
        args.gateway,
        secret_file=args.secret_file,
        site=args.site,
        job=args.job,
        config=config,
        resume_at=None if ckpt is None else ckpt["optimizer"]["iteration"],
    )
    init_s = time.time() - t0
    model = build_model(args.extra_layer)
    opt = wanrt.SparseOptimizer(model.named_parameters(), "adam", lr=args.lr, ctx=ctx)
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
    data = text()
    # a fixed held-out batch, the same at every site: its loss is a function of the parameters alone, so
    # the soak can compare the loss before and after a fault without the batches' noise
    ex, ey = batch(data, "eval", 0, 0, 256)
    log = args.log.open("a") if args.log is not None else None
    first = ctx.iteration
    stop = args.save_at if args.save_at > 0 else args.steps
    while ctx.iteration < stop:
        it = ctx.iteration
        x, y = batch(data, args.site, ctx.rank, it, args.batch)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if log is not None:
            with torch.no_grad():
                held_out = float(torch.nn.functional.cross_entropy(model(ex), ey))
            rec = {
                "t": time.time(),
                "it": it,
                "loss": round(float(loss.detach()), 5),
                "eval": round(held_out, 5),
                "discarded": ctx.last_step_discarded,
                "resyncs": ctx.resyncs,
                "pid": os.getpid(),
            }
            log.write(json.dumps(rec) + "\n")
            log.flush()
        if args.compute_s:
            time.sleep(args.compute_s)  # stands for a larger model's compute (the soak's pace)
    ctx.close()  # applies every outstanding update: the checkpoint below holds them
    if args.save_at > 0 and args.checkpoint is not None:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, args.checkpoint)
    if args.out is not None:
        result = {
            "site": args.site,
            "first_iteration": first,
            "iteration": ctx.iteration,
            "digest": digest(model),
            "resyncs": ctx.resyncs,
            "discarded_steps": ctx.discarded_steps,
            "init_s": init_s,
        }
        args.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
