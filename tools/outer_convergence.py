"""In-process convergence of the outer loop on the demo's link-bound workload: inner steps to the target
loss for per-step sparse exchange and for DiLoCo with H inner steps and a sparse, low-bit pseudo-gradient.

Why in process: the mode choice's cost model (scheduler/control/mode_cost.py) needs the convergence
penalty of a larger H and fewer value bits as a *measured* factor (docs/scheduler.md, "The mode choice");
iterations to a loss do not depend on the link, so they are measured here without daemons, on the same
model, data split, batch and optimizer as the demo (wanrt/demo/workload), and the factor is the ratio of
inner steps to target against per-step exchange. The real-daemon arms of tools/bench_outer.py measure time
and WAN bytes; this measures steps.

The algorithm is DiLoCo (Douillard et al., arXiv 2311.08105, Algorithm 1): each site takes H inner steps
with its own optimizer (here the demo's SGD), the pseudo-gradient Δ = θ_sync − θ_local is averaged across
sites and applied by an outer Nesterov SGD (the paper's lr 0.7, momentum 0.9). The pseudo-gradient is sent
as SparseLoCo does (arXiv 2508.15706): error feedback, the top ``density`` of 16-element blocks, values in
the low-bit coding of wanrt/codec/lowbit.py (one scale per 16 values), the residual keeping what was not
sent. Sites sum in fp32, as the gateways do (docs/codec.md).

Limits, measured: the synchronous, one-worker-per-site form (the defaults) is what the mode choice's
default factors come from. The ``--ranks``/``--staleness`` form is *not* faithful to wanrt.DiLoCo yet: at
ranks 2, staleness 1, int2 3 % it took 232 inner steps at H 4 and did not converge at H 8 within 1 200,
where the real loop (lazy outer momentum, tools/bench_outer.py) reached the target in 224 at H 16. Until it
is, a workload's factors for that form come from real-daemon runs (wanrt/demo/runner.py's
``DEMO_OUTER_STEPS_FACTOR``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from wanrt.codec.lowbit import dequantise, quantise
from wanrt.demo.workload.data import Sampler, load_split
from wanrt.demo.workload.model import build_mlp, evaluate

__all__ = ["OuterRun", "grid", "steps_to_target"]

BLOCK = 16


@dataclass(frozen=True)
class OuterRun:
    """One arm: ``outer_steps`` 1 = per-step sparse exchange of the gradient (wanrt's default mode)."""

    outer_steps: int
    density: float
    coding: str  # fp32 | fp16 | int8 | int4 | int2
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    #: outer steps by which an average is applied late (wanrt.DiLoCo's ``staleness``: 1 overlaps the
    #: exchange with the next H inner steps; docs/outer_loop.md)
    staleness: int = 0


def _code(x: np.ndarray, coding: str) -> np.ndarray:
    if coding == "fp32":
        return x
    if coding == "fp16":
        return x.astype(np.float16).astype(np.float32)
    lv = quantise(x, coding, BLOCK)
    return x if lv is None else dequantise(lv)[: x.size]


def _sparse_ef(x: np.ndarray, residual: np.ndarray, density: float, coding: str) -> np.ndarray:
    """What one site sends of ``x`` (error feedback: the residual is added first and keeps the rest)."""
    acc = x + residual
    n = acc.size
    if density >= 1.0:
        sent = _code(acc, coding)
    else:
        nb = -(-n // BLOCK)
        padded = np.zeros(nb * BLOCK, np.float32)
        padded[:n] = acc
        norms = np.square(padded.reshape(nb, BLOCK)).sum(axis=1)
        k = max(1, round(density * nb))
        keep = np.argpartition(norms, nb - k)[nb - k :]
        mask = np.zeros(nb, bool)
        mask[keep] = True
        sel = padded.reshape(nb, BLOCK)[mask].reshape(-1)
        out = np.zeros((nb, BLOCK), np.float32)
        out[mask] = _code(sel, coding).reshape(-1, BLOCK)
        sent = out.reshape(-1)[:n]
    residual[:] = acc - sent
    return sent


def steps_to_target(
    run: OuterRun,
    *,
    seed: int,
    sites: int,
    batch: int,
    hidden: int,
    lr: float,
    target: float,
    max_steps: int,
    eval_every: int = 5,
    ranks: int = 1,
) -> dict[str, Any]:
    """Inner steps until the loss on the training split is ≤ ``target`` (None: not within ``max_steps``),
    the held-out accuracy then, and the values sent per site per inner step (for the byte ratio)."""
    if run.outer_steps == 1 and ranks != 1:
        raise ValueError("per-step exchange is modelled with one worker per site (batch = the site's)")
    torch.set_num_threads(1)
    data = load_split(seed)
    x_train, y_train, x_test, y_test = data.tensors()
    ref = build_mlp(hidden, seed)
    workers = sites * ranks  # each rank of a site takes its own inner steps (docs/outer_loop.md)
    models = [build_mlp(hidden, seed) for _ in range(workers)]
    sync = [p.detach().reshape(-1).numpy().astype(np.float32, copy=True) for p in ref.parameters()]
    residuals = [[np.zeros_like(s) for s in sync] for _ in range(sites)]
    momentum = [np.zeros_like(s) for s in sync]
    samplers = [Sampler(data, index=i, world=workers, batch=batch, seed=seed) for i in range(workers)]
    late: list[list[np.ndarray]] = []  # averages not applied yet (staleness)
    sent_values = 0
    hit: int | None = None
    loss, acc = float("nan"), float("nan")
    h = run.outer_steps
    for step in range(max_steps):
        grads: list[list[np.ndarray]] = []
        for s, model in enumerate(models):
            model.zero_grad()
            xb, yb = samplers[s].at(step)
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            if h == 1:
                grads.append([p.grad.detach().reshape(-1).numpy().copy() for p in model.parameters()])  # type: ignore[union-attr]
            else:
                with torch.no_grad():
                    for p in model.parameters():
                        p.sub_(lr * p.grad)  # type: ignore[operator]
        if h == 1:  # per-step sparse exchange: the averaged sparse gradient, one SGD step everywhere
            for layer, theta in enumerate(sync):
                total = np.zeros_like(theta)
                for s in range(sites):
                    total += _sparse_ef(grads[s][layer], residuals[s][layer], run.density, run.coding)
                theta -= np.float32(lr) * total / np.float32(sites)
            sent_values += sum(max(1, round(run.density * -(-t.size // BLOCK))) * BLOCK for t in sync)
            _load(models, sync)
        elif (step + 1) % h == 0:  # DiLoCo's outer step (Algorithm 1, lines 8-12)
            averages = []
            for layer, theta in enumerate(sync):
                total = np.zeros_like(theta)
                for s in range(sites):  # the site's ranks averaged, then its leader's EF compression
                    own = [list(models[s * ranks + r].parameters())[layer] for r in range(ranks)]
                    local = sum(p.detach().reshape(-1).numpy() for p in own) / np.float32(ranks)
                    total += _sparse_ef(theta - local, residuals[s][layer], run.density, run.coding)
                averages.append(total / np.float32(sites))
            late.append(averages)
            due = late.pop(0) if len(late) > run.staleness else None
            for layer, theta in enumerate(sync):
                if due is None:
                    continue
                delta = due[layer]
                mom = momentum[layer]
                mom *= np.float32(run.outer_momentum)
                mom += delta
                theta -= np.float32(run.outer_lr) * (delta + np.float32(run.outer_momentum) * mom)  # Nesterov
            sent_values += sum(max(1, round(run.density * -(-t.size // BLOCK))) * BLOCK for t in sync)
            _load(models, sync)
        # the synchronised parameters are what every site holds: with an outer loop they exist only at an
        # outer step, so it is evaluated at each (and at every ``eval_every``-th inner step without one)
        if (step + 1) % (eval_every if h == 1 else h) == 0:
            probe = models[0] if h == 1 else _synced(ref, sync)
            loss, _ = evaluate(probe, x_train, y_train)
            if loss <= target:
                hit = step + 1
                _, acc = evaluate(probe, x_test, y_test)
                break
    return {"steps": hit, "final_loss": loss, "test_acc": acc, "values_sent_per_site": sent_values}


def _load(models: list[torch.nn.Module], sync: list[np.ndarray]) -> None:
    with torch.no_grad():
        for model in models:
            for p, theta in zip(model.parameters(), sync, strict=True):
                p.copy_(torch.from_numpy(theta).reshape(p.shape))


def _synced(ref: torch.nn.Module, sync: list[np.ndarray]) -> torch.nn.Module:
    _load([ref], sync)
    return ref


def grid(
    *,
    hidden: int,
    sites: int,
    batch: int,
    lr: float,
    target: float,
    seed: int,
    ranks: int = 1,
    staleness: int = 0,
    codings: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """The mode choice's calibration: per-step exchange (density 0.02 and dense), then DiLoCo for each H
    candidate of ``[scheduler.mode]`` with a dense fp32 and a 3 % low-bit pseudo-gradient; each entry's
    ``factor`` is its inner steps over per-step's (scheduler/control/mode_config.py's table)."""
    from scheduler.control.mode_config import ModeConfig

    cfg = ModeConfig()
    runs = [OuterRun(1, 0.02, "fp32"), OuterRun(1, 1.0, "fp32")]
    for h in cfg.outer_steps:
        runs += [OuterRun(h, cfg.outer_density[c], c, staleness=staleness) for c in codings or cfg.codings]
    out: dict[str, Any] = {
        "workload": f"MLP width {hidden}, {sites} sites x batch {batch}, SGD lr {lr}, target train loss "
        f"{target}, seed {seed}; outer Nesterov lr 0.7 momentum 0.9",
        "runs": {},
    }
    base: int | None = None
    for run in runs:
        outer = run.outer_steps > 1  # per-step: one worker per site with the site's whole batch
        r = steps_to_target(
            run,
            seed=seed,
            sites=sites,
            batch=batch // ranks if outer else batch,
            hidden=hidden,
            lr=lr,
            target=target,
            max_steps=1200,
            ranks=ranks if outer else 1,
        )
        if base is None:
            base = r["steps"]
        r["factor"] = None if r["steps"] is None or not base else r["steps"] / base
        out["runs"][f"H{run.outer_steps} d{run.density:g} {run.coding}"] = r
        print(f"H={run.outer_steps:<4} d={run.density:<5g} {run.coding:<5} {r}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--sites", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64, help="per site (the demo's 2 ranks x 32)")
    ap.add_argument("--lr", type=float, default=0.3)
    ap.add_argument("--target", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ranks", type=int, default=1, help="outer-loop workers per site (each batch/ranks)")
    ap.add_argument("--staleness", type=int, default=0, help="outer steps an average is applied late")
    ap.add_argument("--codings", help="comma-separated (default: [scheduler.mode]'s)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    codings = tuple(a.codings.split(",")) if a.codings else None
    out = grid(
        hidden=a.hidden,
        sites=a.sites,
        batch=a.batch,
        lr=a.lr,
        target=a.target,
        seed=a.seed,
        ranks=a.ranks,
        staleness=a.staleness,
        codings=codings,
    )
    if a.json is not None:
        a.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
