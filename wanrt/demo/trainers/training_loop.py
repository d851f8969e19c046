"""One demo trainer's training loop: an ordinary PyTorch loop plus the few lines wanrt asks for.

::

    ctx = wanrt.init(gateway_url, site=..., job=..., secret_file=..., config=ClientConfig(...))
    opt = wanrt.SparseOptimizer(model.named_parameters(), "sgd", lr=..., ctx=ctx)
    ctx.set_batch_size(batch); ctx.on_batch_size(sampler.set_batch)   # the scheduler may resize batches
    loss.backward(); opt.step(); opt.zero_grad()
    ctx.close()

The dense baseline and the wanrt runs execute this very code; only the :class:`ClientConfig` differs
(``ClientConfig.dense_baseline()``: every element in fp32, no error feedback, staleness 0) and, with the
scheduler, the gateways' settings. Each run starts from the same initial parameters and draws the same
batches (a function of the iteration and the batch size), so the curves differ only by the exchange and by
the batch sizes the scheduler chose. A batch-size change arrives through ``ctx.on_batch_size`` at the
decision's effective iteration, the same at every rank of every site, and the sampler draws the new size
from that iteration on.

Without a client configuration (``RunOrder.client`` None) the loop trains on its own gradient with the
matching ``torch.optim`` optimizer and no wanrt at all: the compute-only reference that benchmarks divide
by (``tools/bench_scheduler.py``: communication overhead).
"""

from __future__ import annotations

import contextlib
import math
import time
from multiprocessing.connection import Connection

import numpy as np
import torch
import torch.distributed as dist

import wanrt
from wanrt.client import SparseOptimizer
from wanrt.demo.trainers.entry import TrainerSpec
from wanrt.demo.trainers.iteration_profile import IterationProfile
from wanrt.demo.trainers.messages import Booted, Evaluated, Finished, Go, Progress, Ready, RunOrder
from wanrt.demo.trainers.stop_control import StopControl
from wanrt.demo.workload import data as demo_data
from wanrt.demo.workload.model import build_mlp, evaluate, n_parameters, parameter_digest

__all__ = ["Trainer"]

#: gloo collectives inside a site wait at most this long (a dead peer fails the run instead of hanging it)
GROUP_TIMEOUT_S = 300.0


def warm_up(optimizer: str, lr: float, device: torch.device | None = None) -> None:
    """Load (or JIT-compile) the kernels a run uses before any clock starts.

    The fused kernels compile on first use (seconds, or a cache load); whichever run came first would
    otherwise pay for it inside its measured time. Compression, the sparse optimizer and the payload codec
    run once on a throwaway layer, in the sparse and the dense form.
    """
    from wanrt.codec import decode_payload, encode_payload
    from wanrt.codec.kernel_choice import fused_loader
    from wanrt.kernels import ErrorFeedback, make_compressor, make_sparse_optimizer
    from wanrt.payload import SparsePayload, n_blocks

    grad = np.random.default_rng(0).standard_normal(4096).astype(np.float32)
    sparse = ErrorFeedback().compress(0, grad, make_compressor("threshold_v_block", density=0.05))
    dense = SparsePayload.from_dense_blocks(0, grad, np.arange(n_blocks(grad.shape[0], 16)), 16)
    opt = make_sparse_optimizer(optimizer, lr=lr)
    param = np.zeros_like(grad)
    for p in (sparse, dense):
        meta, buffers = encode_payload(p)
        decoded = decode_payload(meta, [memoryview(bytes(b)) for b in buffers])
        opt.step(0, param, decoded)
    fused_loader().wait()  # the dense payload started the codec's background load: let it finish now
    if device is not None and device.type == "cuda":  # NVRTC compiles the CuPy kernels on first use
        from wanrt.client import ClientConfig
        from wanrt.client.leader.device_path import DeviceLayerCompressor

        g = torch.from_numpy(grad).to(device)
        leader = DeviceLayerCompressor(ClientConfig(density=0.05))
        for _ in range(3):  # the first step samples v, the next ones run the fused selection
            payload = leader.compress_tensor(0, g, None, 1.0)
        opt.step(0, torch.zeros_like(g), payload)
        torch.cuda.synchronize(device)


def _local_optimizer(kind: str, model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    """The dense ``torch.optim`` counterpart of the sparse optimizer ``kind`` (same defaults)."""
    params = model.parameters()
    if kind == "momentum":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if kind == "adam":
        return torch.optim.Adam(params, lr=lr)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    return torch.optim.SGD(params, lr=lr)


class Trainer:
    """Joins the site's process group and loads the data once; :meth:`run` trains one run."""

    def __init__(
        self, spec: TrainerSpec, conn: Connection, stops: StopControl, data: demo_data.DigitsSplit
    ) -> None:
        from datetime import timedelta

        torch.set_num_threads(1)
        self.spec = spec
        self.conn = conn
        self.stops = stops
        self.device = torch.device("cpu")
        backend = "gloo"
        if spec.device == "cuda":  # rank r of each site on GPU r (check_device made sure there are enough)
            self.device = torch.device("cuda", spec.rank % torch.cuda.device_count())
            torch.cuda.set_device(self.device)
            backend = "nccl" if spec.ranks > 1 else "gloo"  # gloo cannot reduce CUDA tensors
        dist.init_process_group(
            backend,
            init_method=f"file://{spec.store}",
            rank=spec.rank,
            world_size=spec.ranks,
            timeout=timedelta(seconds=GROUP_TIMEOUT_S),
        )
        self.data = data
        self.x_train, self.y_train, self.x_test, self.y_test = (t.to(self.device) for t in data.tensors())
        params = n_parameters(build_mlp(spec.hidden, spec.seed))
        warm_up(spec.optimizer, spec.lr, self.device)
        conn.send(Booted(spec.site_index, spec.rank, params))

    def run(self, order: RunOrder) -> None:
        spec = self.spec
        batch = order.batch if order.batch is not None else spec.batch
        sampler = demo_data.Sampler(
            self.data, index=spec.global_rank, world=spec.world, batch=batch, seed=spec.seed
        )
        ctx: wanrt.Context | None = None
        opt: SparseOptimizer | torch.optim.Optimizer | wanrt.DiLoCo
        if order.client is None:
            model = build_mlp(spec.hidden, spec.seed).to(self.device)
            opt = _local_optimizer(spec.optimizer, model, spec.lr)
        else:
            ctx = wanrt.init(
                order.gateway_url,
                site=spec.site,
                job=order.job,
                secret_file=spec.secret_file,
                config=order.client,
            )
            model = build_mlp(spec.hidden, spec.seed).to(self.device)
            if order.outer is None:
                opt = SparseOptimizer(model.named_parameters(), spec.optimizer, lr=spec.lr, ctx=ctx)
            else:  # the outer loop (--mode diloco|auto): the same optimizer, local, as DiLoCo's inner one
                o = order.outer
                inner = _local_optimizer(spec.optimizer, model, spec.lr)
                opt = wanrt.DiLoCo(
                    model.named_parameters(),
                    inner,
                    ctx=ctx,
                    sync_every=o.sync_every,
                    outer_lr=o.outer_lr,
                    outer_momentum=o.outer_momentum,
                )
            ctx.set_batch_size(batch)
            ctx.on_batch_size(sampler.set_batch)
        evaluating = spec.evaluator and order.eval_every > 0
        initial = evaluate(model, self.x_train, self.y_train) if evaluating else None
        self.conn.send(Ready(order.run, spec.site_index, spec.rank))
        go = self.conn.recv()
        if not isinstance(go, Go):
            raise TypeError(f"expected Go, got {go!r}")
        iteration = 0  # WAN iterations done (what stop control, progress and the curve count)
        step = 0  # optimizer steps done: one per iteration, or k with local steps (ElasticBSP §4)
        samples = 0
        drawn = sampler.batch
        t_last = t_go = time.monotonic()
        first = spec.site_index == 0 and spec.rank == 0
        profile = IterationProfile(f"{order.run}-{spec.site}", enabled=first)  # WANRT_DEMO_PROFILE only
        if initial is not None:
            _, test_acc = evaluate(model, self.x_test, self.y_test)
            self.conn.send(Evaluated(order.run, 0, initial[0], test_acc, t_last))
        while self.stops.may_start(order.slot, iteration):
            drawn = sampler.batch  # opt.step() may change it for the next iteration
            x, y = sampler.at(step)
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            if order.slowdown is not None:  # --straggler: a slower device, per sample (demo/straggler.py)
                delay = order.slowdown.delay_s(drawn, time.monotonic() - t_go)
                if delay > 0:
                    time.sleep(delay)
            opt.step()
            opt.zero_grad()
            step += 1
            samples += drawn
            done = step if ctx is None else ctx.iteration
            if done == iteration:
                continue  # a held micro-step: its WAN iteration is not over (docs/local_steps.md)
            iteration = done
            t_last = time.monotonic()
            profile.at(iteration)
            if spec.rank == 0:
                self.conn.send(Progress(order.run, spec.site_index, 0, iteration, loss.item(), t_last, drawn))
            if evaluating and iteration % order.eval_every == 0:
                self._evaluate(order.run, model, iteration, t_last, ctx)
        if ctx is not None:
            ctx.close()  # applies every update still outstanding: all ranks of all sites end in one place
        final_loss, final_acc = math.nan, math.nan
        if order.eval_every > 0:
            final_loss, _ = evaluate(model, self.x_train, self.y_train)
            _, final_acc = evaluate(model, self.x_test, self.y_test)
        self.conn.send(
            Finished(
                order.run,
                spec.site_index,
                spec.rank,
                iteration,
                t_last,
                final_loss,
                final_acc,
                parameter_digest(model),
                drawn,
                samples,
            )
        )

    def _evaluate(
        self, run: str, model: torch.nn.Module, iteration: int, t: float, ctx: wanrt.Context | None
    ) -> None:
        # the job's model, not the weight-predicted point the parameters hold between steps: a loss at the
        # predicted point measured one site's guess of the in-flight update (docs/client.md)
        with contextlib.nullcontext() if ctx is None else ctx.job_parameters():
            train_loss, _ = evaluate(model, self.x_train, self.y_train)
            _, test_acc = evaluate(model, self.x_test, self.y_test)
        self.conn.send(Evaluated(run, iteration, train_loss, test_acc, t))

    def shutdown(self) -> None:
        dist.destroy_process_group()
