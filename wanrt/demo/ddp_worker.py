"""One rank of the real-DDP baseline: ``python -m wanrt.demo.ddp_worker SPEC.json``, run inside its site's
network namespace (``ip netns exec``) by :mod:`wanrt.demo.ddp_arm`.

This is what a user who runs plain PyTorch DDP across sites gets: one gloo process group over every rank of
every site (``init_process_group("gloo", world_size=sites × ranks)``), the model wrapped in
:class:`torch.nn.parallel.DistributedDataParallel` (bucketed gradient all-reduce overlapped with the
backward pass, gradients averaged over the world), and a dense ``torch.optim`` step. Gloo binds to the
namespace's WAN device (``GLOO_SOCKET_IFNAME``), so the traffic between sites crosses the shaped veths;
ranks of one site reach each other through that namespace's loopback, as inside a real cluster.

Model, data shard, batches, optimizer and learning rate are the demo trainers' own
(:mod:`wanrt.demo.workload`, ``_local_optimizer``), so the runs differ only by the exchange. The stop rule is
the demo's: the evaluating rank (last rank of the first site) computes the training-split loss every
``eval_every`` iterations and broadcasts "stop" once it is at the target, which every rank learns in the
same collective, so all stop after the same iteration.

Input: one line ``go`` on stdin starts training (anything else, or end of input, makes the rank leave).
Output: one JSON object per line on stdout (``booted``, ``go``, ``step`` from global rank 0, ``eval`` from
the evaluator, ``finished`` from every rank); logs and tracebacks on stderr. Times are ``time.monotonic()``,
which network namespaces share with the parent.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

__all__ = ["WORKER_ENV", "WorkerSpec", "main"]

#: one compute thread per rank (every rank of the job shares the machine's cores), as the demo's trainers
WORKER_ENV: Final = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "NUMBA_NUM_THREADS": "1",
}
#: a collective waits at most this long: a rank that died fails the job instead of hanging it
GROUP_TIMEOUT_S: Final = 300.0


@dataclass(frozen=True)
class WorkerSpec:
    """Everything one rank needs; written as JSON by the parent."""

    rank: int
    world: int
    site_index: int
    local_rank: int
    #: gloo's file:// rendezvous (a path on the shared filesystem: namespaces do not separate it)
    store: str
    #: the demo's data split as ``.npz`` (x_train, y_train, x_test, y_test)
    data: str
    hidden: int
    seed: int
    batch: int
    lr: float
    optimizer: str
    eval_every: int
    target_loss: float
    max_iters: int
    evaluator: bool
    #: the device gloo binds to (the site's WAN veth)
    ifname: str
    #: report this rank's local and all-reduced gradients of the first iteration (tests, tiny models)
    report_gradients: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WorkerSpec:
        return cls(**json.loads(text))


def _emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def _flat_grads(model: Any) -> list[float]:
    import torch

    return [float(v) for v in torch.cat([p.grad.detach().reshape(-1) for p in model.parameters()])]


def train(spec: WorkerSpec) -> None:
    """Join the world group, then train as DDP until the evaluator says stop or ``max_iters``."""
    from datetime import timedelta

    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from wanrt.demo.trainers.training_loop import _local_optimizer
    from wanrt.demo.workload.data import DigitsSplit, Sampler
    from wanrt.demo.workload.model import build_mlp, evaluate, n_parameters, parameter_digest

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{spec.store}",
        rank=spec.rank,
        world_size=spec.world,
        timeout=timedelta(seconds=GROUP_TIMEOUT_S),
    )
    with np.load(spec.data) as z:
        data = DigitsSplit(z["x_train"], z["y_train"], z["x_test"], z["y_test"])
    x_train, y_train, x_test, y_test = data.tensors()
    sampler = Sampler(data, index=spec.rank, world=spec.world, batch=spec.batch, seed=spec.seed)
    model = build_mlp(spec.hidden, spec.seed)
    ddp = DistributedDataParallel(model)  # broadcasts rank 0's parameters: identical anyway (same seed)
    opt = _local_optimizer(spec.optimizer, model, spec.lr)
    # every rank must know who evaluates to join its broadcast: the evaluator announces itself once
    flag = torch.tensor([spec.rank if spec.evaluator else -1], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    evaluator_rank = int(flag.item())
    evaluating = spec.eval_every > 0 and evaluator_rank >= 0
    initial = evaluate(model, x_train, y_train) if evaluating and spec.evaluator else None
    _emit("booted", rank=spec.rank, parameters=n_parameters(model))
    if sys.stdin.readline().strip() != "go":  # the parent may boot the ranks long before it runs them
        dist.destroy_process_group()
        return
    dist.barrier()
    t_last = time.monotonic()
    _emit("go", rank=spec.rank, t=t_last)
    if initial is not None:
        _emit("eval", iteration=0, loss=initial[0], accuracy=evaluate(model, x_test, y_test)[1], t=t_last)
    iteration = 0
    samples = 0
    stop = torch.zeros(1, dtype=torch.int64)
    while iteration < spec.max_iters:
        x, y = sampler.at(iteration)
        if spec.report_gradients and iteration == 0:
            with ddp.no_sync():  # this rank's own gradient, not all-reduced
                torch.nn.functional.cross_entropy(ddp(x), y).backward()
            local = _flat_grads(model)
            opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()  # DDP all-reduces (averages) the gradient buckets during the backward pass
        if spec.report_gradients and iteration == 0:
            _emit("gradients", rank=spec.rank, local=local, reduced=_flat_grads(model))
        opt.step()
        opt.zero_grad()
        iteration += 1
        samples += spec.batch
        t_last = time.monotonic()
        if spec.rank == 0:
            _emit("step", iteration=iteration, loss=float(loss.item()), t=t_last)
        if evaluating and iteration % spec.eval_every == 0:
            if spec.evaluator:
                train_loss, _ = evaluate(model, x_train, y_train)
                _, acc = evaluate(model, x_test, y_test)
                _emit("eval", iteration=iteration, loss=train_loss, accuracy=acc, t=t_last)
                stop[0] = int(train_loss <= spec.target_loss)
            dist.broadcast(stop, src=evaluator_rank)
            if int(stop.item()):
                break
    final_loss = final_acc = float("nan")
    if spec.eval_every > 0:
        final_loss, _ = evaluate(model, x_train, y_train)
        _, final_acc = evaluate(model, x_test, y_test)
    _emit(
        "finished",
        rank=spec.rank,
        site_index=spec.site_index,
        local_rank=spec.local_rank,
        iterations=iteration,
        t_last_step=t_last,
        final_loss=final_loss,
        final_accuracy=final_acc,
        digest=parameter_digest(model),
        samples=samples,
    )
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m wanrt.demo.ddp_worker SPEC.json", file=sys.stderr)
        return 2
    os.environ.update(WORKER_ENV)
    spec = WorkerSpec.from_json(Path(args[0]).read_text())
    os.environ["GLOO_SOCKET_IFNAME"] = spec.ifname
    train(spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
