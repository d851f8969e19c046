"""The trainer's handle on wanrt: one per process, created by :func:`wanrt.init`.

It ties the pieces together around the user's ordinary training loop:

* backward hooks reduce each layer's gradient to the site leader as soon as it is ready
  (:mod:`~wanrt.client.site.grad_reduce`);
* the leader compresses each layer with error feedback and pushes it to the gateway from a worker thread
  (:mod:`~wanrt.client.leader.worker`, :mod:`~wanrt.client.leader.compression`);
* at ``step()`` the leader decides, under the staleness bound, which global updates the site applies now
  (:mod:`~wanrt.client.leader.staleness`, StellaTrain §3.3), broadcasts the decision and the updates inside
  the site (:mod:`~wanrt.client.site.broadcast`), and every rank applies them with the sparse optimizer
  (StellaTrain §3.1), so all ranks of all sites keep identical parameters;
* configuration changes announced by the scheduler take effect at their effective iteration on every rank;
* with ``local_steps`` k > 1 (ElasticBSP §4: several local iterations between two barriers) a WAN iteration
  is k micro-steps: the first k−1 ``step()`` calls only let the gradients accumulate (no reduce, no push, no
  parameter change, ``zero_grad()`` keeps them) and the k-th runs the exchange on the sum;
* a site that missed the job's rounds (its gateway says so) fetches the job's parameters from another site,
  holds the updates that arrive meanwhile, installs the snapshot on the leader and broadcasts it to every
  rank, then applies the held updates the snapshot lacks; asked for its own parameters, the leader answers
  once every update below the asked iteration is applied (:mod:`~wanrt.client.link.param_resync`);
* while such a snapshot is pending (the gateway announced a resync, or the Welcome said ``restart_from``:
  this process replaces one the scheduler restarted), the site keeps stepping but contributes nothing:
  each layer's push is empty (zero blocks) and the error-feedback residuals are dropped, because its
  parameters are known to differ from the job's and gradients computed there would pollute every site's
  update (docs/kill_restart.md). The rounds still see the site's push, so no round waits for it.

Only the leader talks to the network; the other ranks learn everything, including the leader's errors,
from its broadcasts, so a failure on the leader stops the whole site with a message instead of a hang.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import torch
import torch.distributed as dist

from wanrt.client.config import ClientConfig
from wanrt.client.errors import LeaderFailed, StepWithoutBackward
from wanrt.client.leader.device_path import DeviceLayerCompressor
from wanrt.client.leader.staleness import StalenessTracker
from wanrt.client.leader.step_timing import StepTimer
from wanrt.client.leader.worker import LeaderPipeline
from wanrt.client.link.api import (
    Link,
    LinkFactory,
    LinkSpec,
    ResyncAbandoned,
    ResyncStarted,
    ServeRequested,
    SnapshotArrived,
    UpdateArrived,
)
from wanrt.client.link.param_resync import Snapshot, snapshot_frames, snapshot_point
from wanrt.client.link.reconnect import ReconnectPolicy
from wanrt.client.link.signature import LayerSignature

if TYPE_CHECKING:
    from wanrt.client.shard_sampler import ShardSampler
from wanrt.client.site.broadcast import SiteChannel
from wanrt.client.site.decision import OWN_IN_FLIGHT, ConfigChange, SiteDecision, SiteUpdate
from wanrt.client.site.grad_reduce import LayerReducer
from wanrt.client.site.model_check import check_site_model
from wanrt.client.site.prediction import WeightPrediction
from wanrt.client.unclosed import watch_unclosed
from wanrt.errors import (
    ConfigError,
    LocalProtocolError,
    RemoteProtocolError,
    RestartRequested,
    WanrtTimeout,
)
from wanrt.kernels import SparseOptimizer as KernelOptimizer
from wanrt.kernels.state_transfer import export_state, import_state, state_lengths
from wanrt.payload import SparsePayload
from wanrt.rank_telemetry import rank_time_metrics

__all__ = ["Context"]

log = logging.getLogger(__name__)

#: layers per model the leader will describe to its ranks (bounds the signature broadcast)
MAX_LAYERS = 1 << 20
#: how long wanrt.init asks again while the gateway still sees an earlier trainer of this site connected:
#: a torchrun restart after a crash can come before that connection's end (at most the gateway's
#: heartbeat silence, 3 x 5 s by default) reaches it
PROBE_RETRY_S = 20.0
#: what SparseOptimizer.state_dict() says it is (load_state_dict refuses anything else)
CHECKPOINT_FORMAT = "wanrt-sparse-optimizer-1"


class Context:
    """Per-process state of a wanrt trainer. Create with :func:`wanrt.init`; bind with a SparseOptimizer."""

    def __init__(
        self,
        *,
        gateway: str,
        site: str,
        job: str,
        secret: bytes | None,
        config: ClientConfig,
        group: dist.ProcessGroup | None,
        link_factory: LinkFactory,
        device: torch.device,
        owns_group: bool = False,
        resume_at: int | None = None,
    ) -> None:
        self.gateway = gateway
        self.site = site
        self.job = job
        self._secret = secret
        self._config = config
        self._group = group
        self._owns_group = owns_group  # wanrt created the default group (not the user): close() ends it
        self._link_factory = link_factory
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self._device = device
        self._channel = SiteChannel(group, device, max_elements=config.max_layer_elements)
        self._iteration = 0
        self._micro = 0  # micro-steps of the current WAN iteration already done (local_steps > 1)
        self._batch_callbacks: list[Callable[[int], None]] = []
        self._scheduled: list[ConfigChange] = []
        self._announced: list[ConfigChange] = []  # leader: received, not yet broadcast
        self._params: list[torch.Tensor] = []
        self._optimizer: KernelOptimizer | None = None
        self._reducer: LayerReducer | None = None
        self._works: list[Any] = []
        self._link: Link | None = None
        self._pipeline: LeaderPipeline | None = None
        self._compressor: DeviceLayerCompressor | None = None
        self._tracker: StalenessTracker[SiteUpdate] | None = None
        self._closed = False
        self._broken: BaseException | None = None
        self._run = os.urandom(8).hex()  # this training run, as the gateway tells runs apart
        self._resume_at = resume_at  # the checkpoint's iteration this run resumes from (None: none)
        self._timer = StepTimer()  # leader: compute / idle per iteration for the scheduler
        self._batch_size: int | None = None
        self._batch_weight = 1.0
        self._scaled: dict[int, npt.NDArray[np.float32]] = {}  # leader worker: per-layer scaled gradients
        self._avg_bufs: dict[int, npt.NDArray[np.float32]] = {}  # every rank: per-layer averaged updates
        # leader: the site's own payloads by (iteration, layer) until their job update is applied; every
        # rank: the parameters moved to the predicted point between steps (wanrt.client.site.prediction)
        self._own: dict[tuple[int, int], SparsePayload] = {}
        self._prediction = WeightPrediction()
        # parameter resync (leader): updates held while a snapshot is on its way, the snapshot to install
        # at the next step, the last one installed (updates it holds are skipped), peers' questions
        self._resync_at: int | None = None
        self._held: list[SiteUpdate] = []
        self._incoming: Snapshot | None = None
        self._snapshot: Snapshot | None = None
        self._serve: list[tuple[int, int, int]] = []  # (request, iteration, state arrays wanted)
        # leader: this iteration's pushes are empty (a snapshot is pending); changed only between steps,
        # after the pipeline drained, so every layer of one iteration is pushed alike
        self._discarding = False
        #: iterations this site pushed empty because a parameter snapshot was pending (every rank counts
        #: the same: the leader's decision says so)
        self.discarded_steps = 0
        #: the last step's gradients were left out (its samples contributed nothing)
        self.last_step_discarded = False
        self._discard_run = 0  # leader: steps left out in the current pending period (for the log)
        self._abandoned = False  # leader: a ResyncAbandoned arrived since the last step
        #: parameter snapshots installed on this rank (every rank counts the same)
        self.resyncs = 0
        # a forgotten close() warns at exit, on the leader (wanrt/client/unclosed.py)
        self._unwatch = watch_unclosed(self) if self.rank == 0 else None

    # -- what the user sees ------------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    @property
    def config(self) -> ClientConfig:
        """The configuration in force now (changes at the iterations the scheduler announces)."""
        return self._config

    @property
    def iteration(self) -> int:
        """Number of completed WAN iterations = the iteration the next backward belongs to (with
        ``local_steps`` k, one per k ``step()`` calls)."""
        return self._iteration

    @property
    def local_steps(self) -> int:
        """Micro-steps per WAN iteration in force now (changes only at a WAN iteration's start)."""
        return self._config.local_steps

    @property
    def lr_scale(self) -> float:
        """The job's factor on the optimizer's learning rate in force (live ``lr_scale``, 1 by default;
        STAR §IV-C: the scheduler raises it with the samples per WAN iteration, docs/local_steps.md)."""
        return 1.0 if self._optimizer is None else self._optimizer.lr_scale

    @property
    def micro_step(self) -> int:
        """How many micro-steps of the current WAN iteration are done (0 at its start)."""
        return self._micro

    @property
    def accumulating(self) -> bool:
        """True between the micro-steps of one WAN iteration: the gradients hold a partial sum that
        ``zero_grad()`` must keep."""
        return self._micro > 0

    def set_batch_size(self, per_rank: int) -> None:
        """Tell wanrt this rank's batch size, so its telemetry reports samples/s to the scheduler."""
        if type(per_rank) is not int or per_rank < 1:
            raise LocalProtocolError("batch size must be a positive integer", value=per_rank)
        self._batch_size = per_rank

    def on_batch_size(self, callback: Callable[[int], None]) -> None:
        """Call ``callback(new_per_rank_batch_size)`` on every rank when a batch-size change takes effect."""
        self._batch_callbacks.append(callback)

    def shards(self, dataset_len: int, **options: Any) -> ShardSampler:
        """A :class:`~wanrt.client.shard_sampler.ShardSampler` over ``dataset_len`` samples, leasing data
        shards from the job's shard service through this site's gateway (AntDT §IV-C). Call on every rank,
        after the SparseOptimizer is created (the leader's link exists from then on). The site leases as one
        holder and each rank trains its stripe of every shard; the leader shares each grant with the other
        ranks (:mod:`wanrt.client.site.shard_grants`), so every rank must iterate its sampler alike.
        Samples of a step whose gradients were left out (a pending parameter snapshot) are trained again."""
        from wanrt.client.shard_sampler import ShardSampler, ShardSource

        if self._optimizer is None:
            raise LocalProtocolError(
                "no gateway link that carries shard requests yet", hint="create the SparseOptimizer first"
            )
        source: ShardSource | None = None
        if self.is_leader:
            link = self._link
            if link is None or not all(
                hasattr(link, m) for m in ("request_shards", "report_shards", "next_grant")
            ):
                raise LocalProtocolError("this gateway link does not carry shard requests")
            source = link  # type: ignore[assignment]
        relay = None
        if self.world_size > 1:
            from wanrt.client.site.shard_grants import TorchGrantRelay

            relay = TorchGrantRelay(self._group, self._device)
        options.setdefault("discarded", lambda: self.last_step_discarded)
        return ShardSampler(
            source, dataset_len, rank=0, stripe=(self.rank, self.world_size), relay=relay, **options
        )

    def check_gateway(self, *, probe: bool) -> None:
        """Collective (``wanrt.init``): the leader probes its gateway (:mod:`wanrt.client.link.probe`) and
        tells every rank the outcome, so a run the gateway will not serve fails at once on every rank."""
        failure: BaseException | None = None
        if self.is_leader and probe:
            from wanrt.client.link.probe import probe_gateway

            assert self._secret is not None
            try:
                probe_gateway(
                    self.gateway,
                    site=self.site,
                    job=self.job,
                    secret=self._secret,
                    run=self._run,
                    resume_at=self._resume_at,
                    timeout_s=self._config.connect_timeout_s,
                    retry_s=PROBE_RETRY_S,
                )
            except Exception as exc:
                failure = exc
        try:
            if self.is_leader:
                self._send_decision(SiteDecision(), failure)
            else:
                self._recv_decision()
        except BaseException:
            if self._owns_group and dist.is_initialized():
                dist.destroy_process_group()  # as close() would (gloo's threads at exit)
            raise

    # -- binding the model -------------------------------------------------------------------------------

    def attach(self, named_params: Sequence[tuple[str, torch.Tensor]], optimizer: KernelOptimizer) -> None:
        """Bind the model's parameters; collective: every rank of the site calls it (via SparseOptimizer)."""
        if self._closed:
            raise LocalProtocolError("this wanrt context is closed")
        if self._params:
            raise LocalProtocolError(
                "this wanrt context already drives an optimizer",
                hint="create one SparseOptimizer per wanrt.init()",
            )
        if not named_params:
            raise LocalProtocolError("the optimizer got no trainable parameters")
        for name, p in named_params:
            if not p.is_contiguous():
                raise LocalProtocolError(f"parameter {name!r} is not contiguous", name=name)
        sig = LayerSignature.of(
            [n for n, _ in named_params],
            [tuple(p.shape) for _, p in named_params],
            [str(p.dtype).removeprefix("torch.") for _, p in named_params],
        )
        check_site_model(sig, group=self._group, device=self._device, max_layers=MAX_LAYERS)
        self._params = [p for _, p in named_params]
        self._optimizer = optimizer
        if self.is_leader:
            failure: BaseException | None = None
            try:
                assert self._secret is not None
                spec = LinkSpec(
                    self.gateway,
                    self.site,
                    self.job,
                    self._secret,
                    sig,
                    self._config,
                    run=self._run,
                    state_lengths=self._state_lengths,
                    resume_at=self._resume_at,
                    reconnect=ReconnectPolicy.lasting(self._config.reconnect_s),
                )
                self._link = self._link_factory(spec)
                start = getattr(self._link, "start_iteration", 0)
                self._iteration = start if type(start) is int and start > 0 else 0
                if self._iteration:  # restart_from: the gateway resyncs this process's parameters
                    self._begin_discarding(self._iteration)
                elif self._resume_at is not None:  # the checkpoint's iteration (opt.load_state_dict)
                    self._iteration = self._resume_at
            except Exception as exc:
                failure = exc
            # the iteration this site starts at travels to the ranks as the first decision's one change
            # (not 0 for processes that replace ones the scheduler restarted: the job is further on)
            self._send_decision(SiteDecision(config_changes=[ConfigChange(self._iteration)]), failure)
            self._compressor = DeviceLayerCompressor(self._config)
            self._pipeline = LeaderPipeline(self._compress_and_push)
            self._tracker = StalenessTracker(len(self._params), peer=self.gateway)
        else:
            first = self._recv_decision()
            self._iteration = first.config_changes[0].effective_iteration if first.config_changes else 0
        if self._resume_at is not None and self._iteration == self._resume_at:
            log.info("resuming the job from a checkpoint of iteration %d", self._iteration)
        elif self._iteration:
            log.warning(
                "this trainer replaces one that stopped (it crashed, or the scheduler restarted it): "
                "starting at the job's iteration %d (the job's parameters and optimizer state follow by a "
                "parameter resync)",
                self._iteration,
            )
        self._reducer = LayerReducer(
            self._params,
            group=self._group,
            world_size=self.world_size,
            dst=self._leader_global_rank(),
            on_issued=self._on_issued,
        )
        self._reducer.hold = self._config.local_steps > 1

    def _leader_global_rank(self) -> int:
        return 0 if self._group is None else dist.get_global_rank(self._group, 0)

    # -- gradient path -----------------------------------------------------------------------------------

    def _on_issued(self, layer: int, work: Any, grad: torch.Tensor) -> None:
        self._timer.grad_ready(time.monotonic())
        if self._pipeline is not None:
            assert self._tracker is not None and self._compressor is not None
            self._tracker.pushed(self._iteration, layer)
            self._compressor.mark_ready(layer, grad)  # CUDA: the side stream waits for this point only
            self._pipeline.submit(self._iteration, layer, work, grad)
        elif work is not None:
            self._works.append(work)

    def _compress_and_push(self, iteration: int, layer: int, work: Any, grad: torch.Tensor) -> None:
        """Leader worker thread: the site-averaged gradient of one layer → payload → gateway."""
        assert self._compressor is not None and self._link is not None
        if grad.is_cuda and not self._discarding:
            # GPU-resident path: reduce wait, residual and selection on a side stream; only the selection
            # crosses to the host (wanrt/client/leader/device_path.py, docs/client.md "On a GPU")
            payload = self._compressor.compress_tensor(layer, grad, work, float(self._site_scale()))
            self._own[(iteration, layer)] = payload  # weight prediction, as on the host path below
            self._link.push(iteration, layer, payload)
            return
        if work is not None:
            work.wait()
        if self._discarding:
            # a snapshot is pending: the gradient was computed at parameters known to differ from the
            # job's. An empty push keeps the round protocol whole (the site is seen, no round waits for
            # it) and carries no gradient; the residual is not fed either (_decide reset it)
            empty = SparsePayload.empty(layer, grad.numel(), self._config.block_size)
            self._link.push(iteration, layer, empty)
            return
        flat = grad.detach().reshape(-1).to("cpu", torch.float32).numpy()
        # the site's mean gradient, weighted by the site's share of the job's samples (unequal batch sizes)
        # (changed only at the end of a step, after the step's pushes were drained: see _switch_config)
        payload = self._compressor.compress(layer, self._site_mean(layer, flat))
        self._own[(iteration, layer)] = payload  # read by _decide after the pipeline drained
        self._link.push(iteration, layer, payload)

    def _site_mean(self, layer: int, flat: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Leader worker thread: the site's gradient sum scaled to the site's weighted mean.

        Why no new array per call: a fresh product of a 10 M-element layer was the worker's largest cost
        after selection (a 40 MB allocation, its page faults and a pass over memory, every iteration;
        docs/client.md, "Where an iteration's time goes"). A scale of exactly 1 (one rank, equal batch
        weights: every site of tools/bench_e2e.py) changes no bit, so the gradient is compressed as it is
        (the compressors never write their input); any other scale goes into a buffer kept per layer, with
        the same fp32 product as before, so the payloads are bit-identical either way.

        With ``local_steps`` k the gradient is the SUM of k micro-steps' gradients of mean-reduced losses
        (autograd accumulates), so the divisor is ranks × k: the site pushes its mean per sample over the
        k·b·ranks samples of the WAN iteration, times ``batch_weight`` (its share of the job's samples × the
        site count, which the scheduler computes from k·b; ElasticBSP §4, docs/local_steps.md). k = 1
        divides by ranks × 1, the same float as before.
        """
        scale = self._site_scale()
        if scale == np.float32(1.0):
            return flat
        buf = self._scaled.get(layer)
        if buf is None or buf.shape != flat.shape:
            buf = self._scaled[layer] = np.empty_like(flat)
        np.multiply(flat, scale, out=buf)
        return buf

    def _site_scale(self) -> np.float32:
        """The factor from the site's gradient sum to its weighted mean (see :meth:`_site_mean`)."""
        return np.float32(self._batch_weight / (self.world_size * self._config.local_steps))

    # -- the step ----------------------------------------------------------------------------------------

    def step(self) -> None:
        """End of iteration: wait for this step's updates, apply them everywhere, switch config if due."""
        if self._reducer is None or self._optimizer is None:
            raise LocalProtocolError("wanrt context has no optimizer bound", hint="create a SparseOptimizer")
        if self._closed:
            raise LocalProtocolError("step() after close()")
        if self._broken is not None:
            raise LocalProtocolError(f"this wanrt context failed earlier: {self._broken}")
        if self._reducer.finish() == 0:
            raise StepWithoutBackward(self._iteration)
        if self._micro + 1 < self._config.local_steps:
            # a held micro-step (ElasticBSP §4): the gradients stay in p.grad for the next one; nothing
            # is sent, received or applied, and the WAN iteration does not advance
            self._micro += 1
            self._reducer.hold = self._micro + 1 < self._config.local_steps
            return
        self._micro = 0
        self._timer.step(time.monotonic())
        try:
            decision = self._exchange(final=False)
            applying = time.monotonic()
            self._apply(decision)
            self._timer.applied(time.monotonic() - applying)
        except BaseException as exc:
            self._broken = exc  # the site is out of step: no more collectives, not even from hooks
            self._reducer.remove()
            raise
        if self.is_leader:
            self._serve_params()  # the job's parameters, before the prediction moves them
        if decision.predict:
            self._prediction.predict(
                self._params, [u.payload for u in decision.predict], self._optimizer.effective_lr
            )
        self._report(self._iteration)
        self._iteration += 1
        self._switch_config()
        self._reducer.hold = self._config.local_steps > 1  # a new WAN iteration: k may have changed

    def _report(self, iteration: int) -> None:
        """Leader: this iteration's timing to the gateway (StellaTrain §4.1's telemetry), with every rank's
        batch processing time (AntDT §VI-A2's Monitor: a straggler rank inside the site)."""
        bpt = self._timer.bpt()
        times = self._rank_times(-1.0 if bpt is None else bpt)
        metrics = self._timer.metrics(
            time.monotonic(),
            batch_size=self._batch_size,
            world_size=self.world_size,
            local_steps=self._config.local_steps,
        )
        if metrics is not None and self.is_leader and self._link is not None:
            if times is not None and min(times) >= 0:
                metrics.update(rank_time_metrics(times))
            metrics["params"] = float(sum(p.numel() for p in self._params))
            # what ran: the scheduler reads a plan's idle with its payload from the first report on
            metrics["density"] = float(self._config.density)
            metrics["staleness"] = float(self._config.staleness)
            metrics["lr_scale"] = float(self.lr_scale)  # the scale in force (trainer.lr_scale)
            if self.discarded_steps:  # the scheduler sees it as trainer.resync.empty_pushes
                metrics["resync.empty_pushes"] = float(self.discarded_steps)
            self._link.telemetry(iteration, metrics)

    def _rank_times(self, own: float) -> list[float] | None:
        """Every rank's batch processing time of this iteration, on the leader (one small gather per step
        at sites of several ranks; every rank calls it, in step order)."""
        if self.world_size == 1:
            return [own]
        mine = torch.tensor([own], dtype=torch.float64, device=self._device)
        if not self.is_leader:
            dist.gather(mine, None, dst=self._leader_global_rank(), group=self._group)
            return None
        parts = [torch.zeros(1, dtype=torch.float64, device=self._device) for _ in range(self.world_size)]
        dist.gather(mine, parts, dst=self._leader_global_rank(), group=self._group)
        return [float(p.item()) for p in parts]

    def _exchange(self, *, final: bool) -> SiteDecision:
        """Leader: decide and broadcast; others: wait for their reduces and receive the decision."""
        if not self.is_leader:
            works, self._works = self._works, []
            for w in works:
                w.wait()
            return self._recv_decision()
        decision = SiteDecision()
        failure: BaseException | None = None
        try:
            assert self._pipeline is not None and self._tracker is not None
            self._pipeline.drain()
            decision = self._decide(final=final)
        except Exception as exc:
            failure = exc
        self._send_decision(decision, failure)
        return decision

    def _send_decision(self, decision: SiteDecision, failure: BaseException | None) -> None:
        # a site of one rank has nobody to tell: three gloo broadcasts (and the encoding of every update
        # into them) cost ~1 ms per step for nothing (docs/client.md, "Where an iteration's time goes")
        if self.world_size > 1:
            if failure is None:
                self._channel.send(decision)
                return
            self._channel.send(SiteDecision(error=(type(failure).__name__, str(failure))))
        if failure is not None:
            raise failure

    def _recv_decision(self) -> SiteDecision:
        decision = self._channel.recv()
        if decision.error is not None:
            raise LeaderFailed(*decision.error)
        return decision

    def _decide(self, *, final: bool) -> SiteDecision:
        assert self._tracker is not None
        t = self._iteration
        bound = self._config.staleness
        deadline = time.monotonic() + self._config.update_deadline_s
        self._poll(0.0)
        while True:
            missing = self._tracker.outstanding() if final else self._tracker.must_wait(t, bound)
            if not missing:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                it, layer = missing[0]
                raise WanrtTimeout(
                    f"no update from gateway {self.gateway} for iteration {it} layer {layer} within "
                    f"{self._config.update_deadline_s} s ({len(missing)} updates missing at step {t})",
                    phase="update",
                    seconds=self._config.update_deadline_s,
                    hint="is every site's trainer running? raise ClientConfig.update_deadline_s on slow WANs",
                )
            blocked = time.monotonic()
            self._poll(remaining, block=True)
            self._timer.waited(time.monotonic() - blocked)
        self._poll(0.0)
        updates = [r.item for r in self._tracker.take_ready(t)]
        changes, self._announced = self._announced, []
        snapshot = self._incoming is not None
        if snapshot:
            self._snapshot, self._incoming, self._resync_at = self._incoming, None, None
            updates, self._held = self._held + updates, []
        elif self._resync_at is not None:
            self._held.extend(updates)  # may already be in the snapshot on its way
            updates = []
        elif self._held:  # abandoned: nobody sends a snapshot
            updates, self._held = self._held + updates, []
        if self._snapshot is not None:
            snap = self._snapshot
            updates = [u for u in updates if snap.wants(u.iteration, u.layer)]
        updates.sort(key=lambda u: (u.iteration, u.layer))
        discarded = self._discarding and not final  # a close's exchange ends no pushed iteration
        predict = self._in_flight(final=final, holding=self._resync_at is not None or bool(self._held))
        if not final:
            self._next_discarding(t, snapshot=snapshot)
        return SiteDecision(updates, changes, snapshot=snapshot, discarded=discarded, predict=predict)

    def _in_flight(self, *, final: bool, holding: bool) -> list[SiteUpdate]:
        """Leader: the site's own payloads whose job update is still outstanding, for weight prediction.

        None when the config turns it off, for optimizers whose step is not ``−lr·u`` (SGD's), at a close,
        and while a parameter resync holds updates or discards pushes (the own payloads then do not say
        where the job goes)."""
        assert self._tracker is not None
        outstanding = self._tracker.unapplied()
        self._own = {k: v for k, v in self._own.items() if k in outstanding}
        kind = getattr(self._optimizer, "kind", None)
        if final or holding or self._discarding or not self._config.weight_prediction or kind != "sgd":
            return []
        return [
            SiteUpdate(it, layer, OWN_IN_FLIGHT, self._own[(it, layer)]) for it, layer in sorted(self._own)
        ]

    def _next_discarding(self, t: int, *, snapshot: bool) -> None:
        """Leader, between steps (the pipeline drained): count iteration ``t`` if it was pushed empty and
        decide whether iteration ``t + 1`` is. Pending from the resync's start until the snapshot is
        installed (at this step's apply when ``snapshot``); a resync nobody will serve (abandoned) ends it
        too, or the site would never contribute again. A replacement process (``restart_from``) is pending
        from its first iteration, before the gateway's resync notice arrives."""
        if self._discarding:
            self._discard_run += 1
        abandoned, self._abandoned = self._abandoned, False
        if snapshot or (abandoned and self._resync_at is None and self._incoming is None):
            if self._discarding:
                self._end_discarding(t + 1, installed=snapshot)
        elif self._resync_at is not None and not self._discarding:
            self._begin_discarding(t + 1)

    def _begin_discarding(self, iteration: int) -> None:
        self._discarding = True
        self._discard_run = 0
        if self._compressor is not None:
            self._compressor.reset_residuals()  # computed at parameters that were not the job's either
        log.info(
            "parameter resync pending: this site's gradients are left out from iteration %d until the "
            "snapshot is installed (its pushes are empty)",
            iteration,
        )

    def _end_discarding(self, iteration: int, *, installed: bool) -> None:
        self._discarding = False
        assert self._compressor is not None
        self._compressor.reset_residuals()  # nothing of the discarded steps may come back later
        n = self._discard_run
        if installed:
            log.info(
                "parameter resync pending: this site's gradients were left out until the snapshot was "
                "installed (%d steps); they count again from iteration %d",
                n,
                iteration,
            )
        else:
            log.warning(
                "parameter resync abandoned after %d steps left out: this site's gradients count again "
                "from iteration %d, on its own parameters",
                n,
                iteration,
            )

    def _install_snapshot(self) -> None:
        """Every rank: the leader copies the received snapshot into its parameters, the site's other ranks
        receive them by broadcast (so every rank of every site ends with the same parameters). The
        optimizer state (momentum, Adam's moments and step counters) comes with it when the serving site's
        optimizer has the same arrays, and reaches every rank the same way; otherwise each rank keeps its
        own (logged)."""
        assert self._optimizer is not None
        with torch.no_grad():
            state: list[np.ndarray] = []
            if self.is_leader:
                assert self._snapshot is not None
                for p, values in zip(self._params, self._snapshot.layers, strict=True):
                    src = torch.from_numpy(values).to(device=p.device, dtype=p.dtype)
                    p.data.view(-1).copy_(src)
                state = self._snapshot.state
                if not state and self._state_lengths:
                    log.warning(
                        "parameter resync: the serving site sent no optimizer state (its optimizer differs "
                        "from this one); this site keeps its own"
                    )
            if self.world_size > 1:
                self._channel.params(self._params)
                state = self._channel.optimizer_state(state, self._state_lengths)
            if state:
                import_state(self._optimizer, self._dense_lens, self._config.block_size, state)
        self.resyncs += 1

    def _serve_params(self) -> None:
        """Leader: answer the peers' questions whose iteration every applied update has reached: the
        parameters now hold every update of the iterations below K and the ones listed beyond (one model
        copy per answer, made only while a question is pending)."""
        if not self._serve or self._link is None or self._tracker is None:
            return
        send = getattr(self._link, "send_params", None)
        if send is None or self._resync_at is not None or self._incoming is not None or self._discarding:
            return  # this site's own parameters are not the job's yet (or the link cannot answer)
        snap = self._snapshot
        pending = {k for k in self._tracker.unapplied() if snap is None or snap.wants(*k)}
        pushed = self._tracker.last_pushed + 1
        in_snap = frozenset() if snap is None else snap.extras
        high = max([pushed, *(it + 1 for it, _ in in_snap)])
        low = min((it for it, _ in pending), default=pushed)
        if snap is not None:
            low = max(low, snap.iteration)  # every update below it is in the installed snapshot

        def applied(i: int, layer: int) -> bool:
            return (i, layer) in in_snap or (i < pushed and (i, layer) not in pending)

        keep = []
        for request, iteration, state in self._serve:
            point = snapshot_point(iteration, low, applied, high, len(self._params))
            if point is None:
                keep.append((request, iteration, state))
                continue
            layers = [p.detach().reshape(-1).to("cpu", torch.float32).numpy() for p in self._params]
            # the optimizer state too when the asker's optimizer has the same arrays (else it keeps its own)
            arrays = self._state_arrays() if state and state == len(self._state_lengths) else []
            send(list(snapshot_frames(request, point[0], point[1], layers, state=arrays)))
        self._serve = keep

    @property
    def _state_lengths(self) -> tuple[int, ...]:
        assert self._optimizer is not None
        return state_lengths(self._optimizer, self._dense_lens, self._config.block_size)

    @property
    def _dense_lens(self) -> list[int]:
        return [p.numel() for p in self._params]

    def _state_arrays(self) -> list[np.ndarray]:
        assert self._optimizer is not None
        return export_state(self._optimizer, self._dense_lens, self._config.block_size)

    def _poll(self, timeout: float, *, block: bool = False) -> None:
        """Handle the next event (block) or every event already queued (no block)."""
        assert self._link is not None and self._tracker is not None
        while True:
            event = self._link.get(timeout if block else 0.0)
            if event is None:
                return
            if isinstance(event, UpdateArrived):
                self._tracker.arrived(event.iteration, event.layer, self._check_update(event))
            elif isinstance(event, ResyncStarted):
                log.warning(
                    "this site missed the job's rounds before iteration %d: fetching the job's "
                    "parameters from another site",
                    event.iteration,
                )
                self._resync_at = event.iteration
            elif isinstance(event, SnapshotArrived):
                self._incoming = event.snapshot
            elif isinstance(event, ResyncAbandoned):
                self._resync_at = None  # the held updates are applied at this step
                self._abandoned = True
            elif isinstance(event, ServeRequested):
                self._serve.append((event.request, event.iteration, event.state))
            else:
                self._announced.append(event)
            if block:
                return

    def _check_update(self, ev: UpdateArrived) -> SiteUpdate:
        """Everything the gateway says about a layer must fit our model before it touches parameters."""
        if not 0 <= ev.layer < len(self._params):
            raise RemoteProtocolError(
                f"update for unknown layer {ev.layer}", peer=self.gateway, layer=ev.layer
            )
        numel = self._params[ev.layer].numel()
        if ev.payload.dense_len != numel or ev.payload.layer != ev.layer:
            raise RemoteProtocolError(
                f"update for layer {ev.layer} has {ev.payload.dense_len} elements, the layer has {numel}",
                peer=self.gateway,
                layer=ev.layer,
            )
        if not ev.sites:
            raise RemoteProtocolError("update lists no contributing site", peer=self.gateway, layer=ev.layer)
        # kept in its wire dtype: _apply widens it once, straight into the averaging buffer
        return SiteUpdate(ev.iteration, ev.layer, len(ev.sites), ev.payload)

    def _apply(self, decision: SiteDecision) -> None:
        """Every rank: average each summed update over its contributing sites and apply it sparsely."""
        assert self._optimizer is not None
        self._prediction.restore(self._params)  # the job's parameters, exactly, before its updates
        self.last_step_discarded = decision.discarded
        self.discarded_steps += int(decision.discarded)
        if decision.snapshot:
            self._install_snapshot()
        with torch.no_grad():
            for u in decision.updates:
                p = u.payload
                avg = SparsePayload(p.layer, p.dense_len, p.block_size, p.indices, self._averaged(u), "fp32")
                self._optimizer.step(u.layer, self._params[u.layer].data.view(-1), avg)
        self._scheduled.extend(decision.config_changes)

    def _averaged(self, u: SiteUpdate) -> npt.NDArray[np.float32]:
        """The update's values as fp32 divided by its contributing sites, in a buffer kept per layer.

        Why not ``values_f32() * (1 / n)``: that is two fresh layer-sized arrays per update (their page
        faults, and NumPy's fp16 widening at ~1–2 ns per element: 10 ms for a 5 M-element dense update,
        the largest part of a dense step's apply; docs/round_bench.md, "Through the client"). torch widens
        fp16 with vector instructions, exactly (every fp16 is an fp32), and the fp32 product by
        ``float32(1/n)`` is the very product NumPy computed, so the applied values are bit-identical.
        """
        p = u.payload
        n = p.nnz
        scale = np.float32(1.0 / u.n_sites)
        if p.value_dtype == "fp32" and scale == np.float32(1.0):
            return p.values  # one site, fp32: the values as they are (the optimizer only reads them)
        buf = self._avg_bufs.get(u.layer)
        if buf is None or buf.shape[0] < n:
            buf = self._avg_bufs[u.layer] = np.empty(max(n, 1), dtype=np.float32)
        out = buf[:n]
        if p.value_dtype == "fp16":
            if p.values.flags.writeable:
                src = torch.from_numpy(p.values)
            else:  # a received payload is a read-only view of the frame; torch only reads it here
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)
                    src = torch.from_numpy(p.values)
            torch.from_numpy(out).copy_(src)
        else:
            np.copyto(out, p.values_f32())
        if scale != np.float32(1.0):
            torch.from_numpy(out).mul_(float(scale))  # an fp32 tensor times an fp32-exact scalar: fp32
        return out

    def _switch_config(self) -> None:
        due = [c for c in self._scheduled if c.effective_iteration <= self._iteration]
        if not due:
            return
        restart: ConfigChange | None = None
        self._scheduled = [c for c in self._scheduled if c.effective_iteration > self._iteration]
        for change in sorted(due, key=lambda c: c.effective_iteration):
            if change.effective_iteration < self._iteration:
                log.warning(
                    "config change for iteration %d arrived late; applied from iteration %d",
                    change.effective_iteration,
                    self._iteration,
                )
            updates: dict[str, Any] = {}
            if change.density is not None:
                updates["density"] = change.density
            if change.staleness is not None:
                updates["staleness"] = change.staleness
            if change.local_steps is not None:
                updates["local_steps"] = change.local_steps
            self._config = self._config.with_changes(**updates)
            if self._compressor is not None:
                self._compressor.set_density(self._config.density)
            if change.batch_weight is not None:
                self._batch_weight = change.batch_weight
            if change.lr_scale is not None and self._optimizer is not None:
                # STAR §IV-C's ADJUST_LR: on every rank at the same WAN iteration, beside the user's lr
                self._optimizer.lr_scale = change.lr_scale
            if change.batch_size is not None:
                self._batch_size = change.batch_size
                for cb in self._batch_callbacks:
                    cb(change.batch_size)
            if change.restart is not None:
                if change.effective_iteration < self._iteration:
                    log.warning(
                        "restart order for rank %d at iteration %d arrived late (now %d): ignored",
                        change.restart,
                        change.effective_iteration,
                        self._iteration,
                    )
                else:
                    restart = change
        if restart is not None:
            self._restart(restart)

    def _restart(self, change: ConfigChange) -> None:
        """The scheduler's KILL_RESTART (AntDT §V-E3) reached its iteration, on every rank of the site at
        once: the hook on the named rank, or (no hook) a clean close everywhere and RestartRequested. The
        close first, so the process leaves nothing owed: its pushes are sent and their results received,
        and the gateway hands the next trainer process the job from the next iteration on."""
        rank = change.restart
        assert rank is not None
        hook = self._config.on_restart
        if hook is not None:
            if rank == self.rank:
                hook(rank, self._iteration)
            return
        iteration = self._iteration
        log.warning(
            "the scheduler ordered rank %d of site %s restarted at iteration %d: closing this context",
            rank,
            self.site,
            iteration,
        )
        self.close()
        who = "this rank" if rank == self.rank else f"rank {rank} of this site"
        raise RestartRequested(
            f"the scheduler asked to restart {who} at iteration {iteration} (a persistent straggler, "
            "AntDT KILL_RESTART); the context is closed. Let the exception end the process: under "
            "`torchrun --max-restarts=N` the elastic agent restarts the site's worker group, which rejoins "
            "the job with its current parameters (set ClientConfig.on_restart to handle it yourself)",
            rank=rank,
            iteration=iteration,
            site=self.site,
        )

    # -- checkpoint and resume ---------------------------------------------------------------------------

    def optimizer_state(self) -> dict[str, Any]:
        """What ``SparseOptimizer.state_dict()`` returns: the optimizer kernel's per-parameter state and
        your ``lr``, the live ``lr_scale``, density, staleness, local steps and batch weight in force, the
        iteration, and (site leader) the error-feedback residuals and compressor thresholds. Take it where
        no update is in flight — after ``ctx.close()`` (which applies every outstanding update), or at
        staleness 0 between steps — so a run resumed from it continues exactly where this one stopped."""
        if self._optimizer is None:
            raise LocalProtocolError("no optimizer bound to this context yet")
        if self._micro:
            raise LocalProtocolError(
                f"state_dict() between the micro-steps of iteration {self._iteration}",
                hint="checkpoint after the last micro-step of a WAN iteration",
            )
        if self._discarding or self._resync_at is not None or self._incoming is not None:
            raise LocalProtocolError(
                "state_dict() while this site waits for the job's parameters (a parameter resync)",
                hint="checkpoint at another site, or a few steps later",
            )
        in_flight = [] if self._closed or self._tracker is None else self._tracker.outstanding()
        if in_flight:
            it, layer = in_flight[0]
            raise LocalProtocolError(
                f"state_dict() with {len(in_flight)} updates in flight (iteration {it} layer {layer}): a run "
                "resumed from it would miss them",
                hint="call ctx.close() first (it applies every outstanding update), or use staleness 0",
            )
        cfg = self._config
        return {
            "format": CHECKPOINT_FORMAT,
            "iteration": self._iteration,
            "kernel": self._optimizer.state_dict(),
            "lr_scale": self._optimizer.lr_scale,
            "settings": {
                "density": cfg.density,
                "staleness": cfg.staleness,
                "local_steps": cfg.local_steps,
                "batch_weight": self._batch_weight,
            },
            "compression": None if self._compressor is None else self._compressor.state_dict(),
        }

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        """``SparseOptimizer.load_state_dict()``: restore :meth:`optimizer_state`'s output. The run must
        continue at the checkpoint's iteration (``wanrt.init(..., resume_at=state["iteration"])``: the
        gateways let it in only there), before its first step."""
        if self._optimizer is None:
            raise LocalProtocolError("no optimizer bound to this context yet")
        if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
            raise ConfigError(
                "not a wanrt SparseOptimizer state_dict (format "
                f"{state.get('format') if isinstance(state, dict) else type(state).__name__!r})",
                key="state_dict",
            )
        it = state.get("iteration")
        if type(it) is not int or it != self._iteration:
            raise ConfigError(
                f"this checkpoint is of iteration {it}, but this run continues at iteration "
                f"{self._iteration}: pass resume_at={it} to wanrt.init to resume from it",
                key="resume_at",
                value=it,
            )
        if self._began_training():
            raise LocalProtocolError("load_state_dict() after training began: load before the first step")
        settings = state.get("settings")
        if not isinstance(settings, dict):
            raise ConfigError("the checkpoint lacks its 'settings' table", key="state_dict")
        self._optimizer.load_state_dict(state["kernel"])
        self._optimizer.lr_scale = float(state.get("lr_scale", 1.0))
        self._config = self._config.with_changes(
            density=settings["density"], staleness=settings["staleness"], local_steps=settings["local_steps"]
        )
        self._batch_weight = float(settings["batch_weight"])
        if self._compressor is not None:
            self._compressor.set_density(self._config.density)
            comp = state.get("compression")
            if isinstance(comp, dict):
                self._compressor.load_state_dict(comp)
        if self._reducer is not None:
            self._reducer.hold = self._config.local_steps > 1

    def _began_training(self) -> bool:
        start = self._resume_at if self._resume_at is not None else 0
        return self._iteration != start or self._micro != 0

    def job_parameters(self) -> contextlib.AbstractContextManager[None]:
        """Within ``with ctx.job_parameters():`` the model holds the job's parameters (identical at every
        site), not the weight-predicted point it holds between steps (wanrt/client/site/prediction.py): for
        evaluating or checkpointing between two ``step()`` calls. Leaves the predicted point as it was."""
        return self._prediction.suspended(self._params)

    # -- shutdown ----------------------------------------------------------------------------------------

    def close(self) -> None:
        """Collective: apply every outstanding update, then close the link (and the default process
        group if :func:`wanrt.init` created it; one the user created is left as it was). Idempotent.

        After a failed step only local resources are released: the ranks are no longer in step, and a
        collective now could hang.
        """
        if self._closed:
            return
        self._closed = True
        if self._unwatch is not None:
            self._unwatch()
        self._prediction.restore(self._params)  # also after a failed step: leave the job's parameters
        try:
            if self._micro and self._broken is None:
                log.warning(
                    "close() after %d of %d micro-steps of iteration %d: their accumulated gradients are "
                    "not sent",
                    self._micro,
                    self._config.local_steps,
                    self._iteration,
                )
            if self._reducer is not None:
                self._reducer.remove()
                if self._broken is None:
                    self._apply(self._exchange(final=True))
        finally:
            if self._pipeline is not None:
                self._pipeline.close()
            if self._link is not None:
                self._link.close(self._config.close_timeout_s)
            if self._owns_group and dist.is_initialized():
                # a process group left to the interpreter's exit can abort it ("terminate called without
                # an active exception", gloo's threads); one the user created stays theirs to end
                dist.destroy_process_group()

    def leave_at_exit(self) -> None:
        """The leader's non-collective part of :meth:`close`, for a context left open at interpreter exit
        (wanrt/client/unclosed.py): finish the pushes handed to the worker, flush the link and say Bye, so
        no other site waits for them. Every failure is swallowed: the process is exiting anyway."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._pipeline is not None:
                self._pipeline.close()
            if self._link is not None:
                self._link.close(self._config.close_timeout_s)
        except Exception as exc:  # at exit: nothing left to tell but the log
            log.warning("leaving at exit: %s", exc)

    @property
    def unclosed_steps(self) -> int:
        """Iterations trained by an open context that did not fail (0 once closed): what a forgotten
        ``close()`` leaves unsettled (wanrt/client/unclosed.py)."""
        return 0 if self._closed or self._broken is not None else self._iteration

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        role = "leader" if self.is_leader else "rank"
        return f"<wanrt.Context site={self.site!r} {role} {self.rank}/{self.world_size} it={self._iteration}>"
