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

The context owns the step and every decision in it (what to wait for, what the site applies, when to
switch); what it keeps beside that lives in parts it composes: the settings in force and those announced
(:class:`~wanrt.client.site.settings_in_force.SettingsInForce`), the leader's compress-and-push path
(:class:`~wanrt.client.leader.push_path.LeaderPush`), the parameter resync
(:class:`~wanrt.client.leader.resync_state.ResyncState`), the averaging and applying of updates
(:class:`~wanrt.client.site.update_apply.UpdateApplier`), the telemetry
(:class:`~wanrt.client.site.step_report.StepReport`) and the checkpoint format
(:mod:`wanrt.client.checkpoint`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from wanrt.client.checkpoint import (
    check_checkpoint,
    check_checkpointable,
    checkpoint_state,
    restore_checkpoint,
)
from wanrt.client.config import ClientConfig
from wanrt.client.errors import StepWithoutBackward, UnknownTensor
from wanrt.client.leader.device_path import DeviceLayerCompressor
from wanrt.client.leader.push_path import LeaderPush
from wanrt.client.leader.resync_state import ResyncState
from wanrt.client.leader.staleness import StalenessTracker
from wanrt.client.leader.step_timing import StepTimer
from wanrt.client.leader.worker import LeaderPipeline
from wanrt.client.link.api import Link, LinkFactory, LinkSpec, UpdateArrived
from wanrt.client.link.reconnect import ReconnectPolicy
from wanrt.client.outer.exchange import OuterExchange

if TYPE_CHECKING:
    from wanrt.client.shard_sampler import ShardSampler
    from wanrt.client.tensor_api import AllReduceHandle, TensorAverager
from wanrt.client.site.broadcast import SiteChannel
from wanrt.client.site.decision import OWN_IN_FLIGHT, ConfigChange, SiteDecision, SiteUpdate
from wanrt.client.site.grad_reduce import LayerReducer
from wanrt.client.site.model_check import check_site_model, model_signature
from wanrt.client.site.outer_mode import OuterModeView
from wanrt.client.site.prediction import WeightPrediction
from wanrt.client.site.restart_order import carry_out_restart, log_start
from wanrt.client.site.settings_in_force import SettingsInForce
from wanrt.client.site.step_report import StepReport
from wanrt.client.site.update_apply import UpdateApplier, site_update
from wanrt.client.unclosed import leave_quietly, watch_unclosed
from wanrt.errors import LocalProtocolError, WanrtTimeout
from wanrt.kernels import SparseOptimizer as KernelOptimizer

__all__ = ["Context"]

log = logging.getLogger(__name__)

#: layers per model the leader will describe to its ranks (bounds the signature broadcast)
MAX_LAYERS = 1 << 20
#: how long wanrt.init asks again while the gateway still sees an earlier trainer of this site connected:
#: a torchrun restart after a crash can come before that connection's end (at most the gateway's
#: heartbeat silence, 3 x 5 s by default) reaches it
PROBE_RETRY_S = 20.0


class Context(OuterModeView):
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
        self._settings = SettingsInForce(config)
        self._group = group
        self._owns_group = owns_group  # wanrt created the default group (not the user): close() ends it
        self._link_factory = link_factory
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self._device = device
        self._channel = SiteChannel(group, device, max_elements=config.max_layer_elements)
        self._iteration = 0
        self._micro = 0  # micro-steps of the current WAN iteration already done (local_steps > 1)
        self._outer: OuterExchange | None = None  # an outer loop drives the exchange (DiLoCo, tensor API)
        self._tensors: TensorAverager | None = None  # the tensor API's registered tensors
        self._announced: list[ConfigChange] = []  # leader: received, not yet broadcast
        self._params: list[torch.Tensor] = []
        self._optimizer: KernelOptimizer | None = None
        self._reducer: LayerReducer | None = None
        self._works: list[Any] = []
        self._link: Link | None = None
        self._pipeline: LeaderPipeline | None = None
        self._compressor: DeviceLayerCompressor | None = None
        self._push: LeaderPush | None = None  # leader: the worker's compress-and-push path
        self._resync: ResyncState | None = None  # from attach on
        self._tracker: StalenessTracker[SiteUpdate] | None = None
        self._closed = False
        self._broken: BaseException | None = None
        self._run = os.urandom(8).hex()  # this training run, as the gateway tells runs apart
        self._resume_at = resume_at  # the checkpoint's iteration this run resumes from (None: none)
        self._timer = StepTimer()  # leader: compute / idle per iteration for the scheduler
        dst = self._leader_global_rank()
        self._telemetry = StepReport(
            self._timer, group, device, rank=self.rank, world_size=self.world_size, dst=dst
        )
        self._applier = UpdateApplier(pinned_bytes=self.config.pinned_update_bytes)
        # every rank: the parameters moved to the predicted point between steps (wanrt.client.site.prediction)
        self._prediction = WeightPrediction()
        #: iterations this site pushed empty because a parameter snapshot was pending (every rank counts
        #: the same: the leader's decision says so)
        self.discarded_steps = 0
        #: the last step's gradients were left out (its samples contributed nothing)
        self.last_step_discarded = False
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
        return self._settings.config

    @property
    def iteration(self) -> int:
        """Number of completed WAN iterations = the iteration the next backward belongs to (with
        ``local_steps`` k, one per k ``step()`` calls)."""
        return self._iteration

    @property
    def local_steps(self) -> int:
        """Micro-steps per WAN iteration in force now (changes only at a WAN iteration's start)."""
        return self.config.local_steps

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
        self._settings.batch_size = per_rank

    def on_batch_size(self, callback: Callable[[int], None]) -> None:
        """Call ``callback(new_per_rank_batch_size)`` on every rank when a batch-size change takes effect."""
        self._settings.on_batch_size(callback)

    def shards(self, dataset_len: int, **options: Any) -> ShardSampler:
        """A :class:`~wanrt.client.shard_sampler.ShardSampler` over ``dataset_len`` samples, leasing data
        shards from the job's shard service through this site's gateway (AntDT §IV-C). Call on every rank,
        after the SparseOptimizer is created (the leader's link exists from then on). The site leases as one
        holder and each rank trains its stripe of every shard; the leader shares each grant with the other
        ranks (:mod:`wanrt.client.site.shard_grants`), so every rank must iterate its sampler alike.
        Samples of a step whose gradients were left out (a pending parameter snapshot) are trained again."""
        from wanrt.client.site.shard_grants import site_sampler

        if self._optimizer is None:
            raise LocalProtocolError(
                "no gateway link that carries shard requests yet", hint="create the SparseOptimizer first"
            )
        options.setdefault("discarded", lambda: self.last_step_discarded)
        return site_sampler(
            self.is_leader,
            self._link,
            dataset_len,
            self.rank,
            self.world_size,
            self._group,
            self._device,
            options,
        )

    def check_gateway(self, *, probe: bool) -> None:
        """Collective (``wanrt.init``): the leader probes its gateway (:mod:`wanrt.client.link.probe`) and
        tells every rank the outcome, so a run the gateway will not serve fails at once on every rank."""
        failure: BaseException | None = None
        if self.is_leader and probe:
            from wanrt.client.link.probe import probe_failure

            assert self._secret is not None
            failure = probe_failure(
                self.gateway, self.site, self.job, self._secret, self._run, self._resume_at,
                timeout_s=self.config.connect_timeout_s, retry_s=PROBE_RETRY_S,
            )  # fmt: skip
        try:
            if self.is_leader:
                self._channel.send_outcome(SiteDecision(), failure)
            else:
                self._channel.recv_checked()
        except BaseException:
            if self._owns_group and dist.is_initialized():
                dist.destroy_process_group()  # as close() would (gloo's threads at exit)
            raise

    # -- binding the model -------------------------------------------------------------------------------

    def attach(
        self,
        named_params: Sequence[tuple[str, torch.Tensor]],
        optimizer: KernelOptimizer,
        *,
        outer_loop: bool = False,
        synchronous: bool = False,
    ) -> None:
        """Bind the model's parameters; collective: every rank of the site calls it (via SparseOptimizer).
        ``outer_loop``/``synchronous``: see :class:`~wanrt.client.outer.exchange.OuterExchange`."""
        if self._closed:
            raise LocalProtocolError("this wanrt context is closed")
        if self._params:
            raise LocalProtocolError(
                "this wanrt context already drives an optimizer",
                hint="create one SparseOptimizer per wanrt.init()",
            )
        sig = model_signature(named_params)
        check_site_model(sig, group=self._group, device=self._device, max_layers=MAX_LAYERS)
        self._params = [p for _, p in named_params]
        self._optimizer = optimizer
        self._resync = ResyncState(
            self._params,
            optimizer,
            self._channel,
            is_leader=self.is_leader,
            world_size=self.world_size,
            block_size=self.config.block_size,
            reset_residuals=self._reset_residuals,
        )
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
                    self.config,
                    run=self._run,
                    state_lengths=self._resync.state_lengths,
                    resume_at=self._resume_at,
                    reconnect=ReconnectPolicy.lasting(self.config.reconnect_s),
                )
                self._link = self._link_factory(spec)
                start = getattr(self._link, "start_iteration", 0)
                self._iteration = start if type(start) is int and start > 0 else 0
                if self._iteration:  # restart_from: the gateway resyncs this process's parameters
                    self._resync.begin_discarding(self._iteration)
                elif self._resume_at is not None:  # the checkpoint's iteration (opt.load_state_dict)
                    self._iteration = self._resume_at
            except Exception as exc:
                failure = exc
            # the iteration this site starts at travels to the ranks as the first decision's one change
            # (not 0 for processes that replace ones the scheduler restarted: the job is further on)
            self._channel.send_outcome(SiteDecision(config_changes=[ConfigChange(self._iteration)]), failure)
            self._compressor = DeviceLayerCompressor(self.config)
            resync = self._resync
            push = self._push = LeaderPush(
                self._settings, self.world_size, self._compressor, self._link, lambda: resync.discarding,
                silent=lambda layer: self._outer is not None and layer in self._outer.silent,
                outer_loop=outer_loop,
            )  # fmt: skip
            self._pipeline = LeaderPipeline(push.compress_and_push)
            self._tracker = StalenessTracker(len(self._params), peer=self.gateway)
        else:
            first = self._channel.recv_checked()
            self._iteration = first.config_changes[0].effective_iteration if first.config_changes else 0
        log_start(self._iteration, self._resume_at)
        self._reducer = LayerReducer(
            self._params,
            group=self._group,
            world_size=self.world_size,
            dst=self._leader_global_rank(),
            on_issued=self._on_issued,
        )
        if outer_loop:
            self._outer = OuterExchange(
                self._reducer, check=self._check_steppable, end_iteration=self._end_iteration,
                synchronous=synchronous,
            )  # fmt: skip
        self._reducer.hold = self._holding()

    def _holding(self) -> bool:
        """Whether backward hooks only mark their layer (no reduce): between micro-steps, or always under
        an outer loop (it pushes at its outer step)."""
        return self._outer is not None or self.config.local_steps > 1

    def _reset_residuals(self) -> None:
        """Leader: drop the error-feedback residuals (a parameter resync: computed at other parameters)."""
        if self._compressor is not None:
            self._compressor.reset_residuals()

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

    # -- the step ----------------------------------------------------------------------------------------

    def _check_steppable(self) -> None:
        if self._reducer is None or self._optimizer is None:
            raise LocalProtocolError("wanrt context has no optimizer bound", hint="create a SparseOptimizer")
        if self._closed:
            raise LocalProtocolError("step() after close()")
        if self._broken is not None:
            raise LocalProtocolError(f"this wanrt context failed earlier: {self._broken}")

    @property
    def outer_exchange(self) -> OuterExchange:
        """The outer loop's side of the step (``attach(..., outer_loop=True)``: DiLoCo, the tensor API)."""
        if self._outer is None:
            raise LocalProtocolError("this context is not driven by an outer loop", hint="use wanrt.DiLoCo")
        return self._outer

    def step(self) -> None:
        """End of iteration: wait for this step's updates, apply them everywhere, switch config if due.

        Under an outer loop (``attach(..., outer_loop=True)``) this is the outer step: every parameter's
        ``.grad`` (the pseudo-gradient the loop set, no backward needed) is the site's contribution."""
        self._check_steppable()
        assert self._reducer is not None and self._optimizer is not None
        if self._outer is not None:
            self._outer.step()
            return
        if self._reducer.finish() == 0:
            raise StepWithoutBackward(self._iteration)
        if self._micro + 1 < self.config.local_steps:
            # a held micro-step (ElasticBSP §4): the gradients stay in p.grad for the next one; nothing
            # is sent, received or applied, and the WAN iteration does not advance
            self._micro += 1
            self._reducer.hold = self._micro + 1 < self.config.local_steps
            return
        self._micro = 0
        self._end_iteration()

    def _end_iteration(self) -> None:
        """The exchange, the apply and the switch that end a WAN iteration (every rank)."""
        assert self._reducer is not None and self._optimizer is not None
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
        if self.is_leader and self._resync is not None:  # to peers that asked, before the prediction
            self._resync.serve(self._link, self._tracker)
        if decision.predict:
            self._prediction.predict(
                self._params, [u.payload for u in decision.predict], self._optimizer.effective_lr
            )
        self._report(self._iteration, None if self._outer is None else self._outer.iteration_done())
        self._iteration += 1
        self._switch_config()
        self._reducer.hold = self._holding()  # a new WAN iteration: k may have changed

    def _report(self, iteration: int, inner_steps: int | None) -> None:
        """Leader: this iteration's timing to the gateway (StellaTrain §4.1's telemetry), with every rank's
        batch processing time (AntDT §VI-A2's Monitor: a straggler rank inside the site)."""
        metrics = self._telemetry.collect(
            self._settings, self._params, self.lr_scale, self.discarded_steps, inner_steps=inner_steps
        )
        if metrics is not None and self._link is not None:
            self._link.telemetry(iteration, metrics)

    def _exchange(self, *, final: bool) -> SiteDecision:
        """Leader: decide and broadcast; others: wait for their reduces and receive the decision."""
        if not self.is_leader:
            works, self._works = self._works, []
            for w in works:
                w.wait()
            return self._channel.recv_checked()
        decision = SiteDecision()
        failure: BaseException | None = None
        try:
            assert self._pipeline is not None and self._tracker is not None
            self._pipeline.drain()
            decision = self._decide(final=final)
        except Exception as exc:
            failure = exc
        self._channel.send_outcome(decision, failure)
        return decision

    def _decide(self, *, final: bool) -> SiteDecision:
        assert self._tracker is not None and self._resync is not None
        t = self._iteration
        cfg = self.config
        bound = cfg.staleness if self._outer is None else self._outer.bound(cfg.staleness)
        deadline = time.monotonic() + cfg.update_deadline_s
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
                    f"{cfg.update_deadline_s} s ({len(missing)} updates missing at step {t})",
                    phase="update",
                    seconds=cfg.update_deadline_s,
                    hint="is every site's trainer running? raise ClientConfig.update_deadline_s on slow WANs",
                )
            blocked = time.monotonic()
            self._poll(remaining, block=True)
            self._timer.waited(time.monotonic() - blocked)
        self._poll(0.0)
        upto = t if self._outer is None else self._outer.apply_upto(t, bound, final=final)
        updates = [r.item for r in self._tracker.take_ready(upto)]
        changes, self._announced = self._announced, []
        # held while a snapshot is on its way; the outer loop installs it at the step its results reach
        updates, snapshot = self._resync.take(updates, None if self._outer is None or final else upto)
        updates.sort(key=lambda u: (u.iteration, u.layer))
        discarded = self._resync.discarding and not final  # a close's exchange ends no pushed iteration
        predict = self._in_flight(final=final, holding=self._resync.holding)
        if not final:
            self._resync.next_discarding(t, snapshot=snapshot)
        return SiteDecision(updates, changes, snapshot=snapshot, discarded=discarded, predict=predict)

    def _in_flight(self, *, final: bool, holding: bool) -> list[SiteUpdate]:
        """Leader: the site's own payloads whose job update is still outstanding, for weight prediction.

        None when the config turns it off, for optimizers whose step is not ``−lr·u`` (SGD's), at a close,
        and while a parameter resync holds updates or discards pushes (the own payloads then do not say
        where the job goes)."""
        assert self._tracker is not None and self._push is not None and self._resync is not None
        outstanding = self._tracker.unapplied()
        own = self._push.own = {k: v for k, v in self._push.own.items() if k in outstanding}
        kind = getattr(self._optimizer, "kind", None)
        if self._outer is not None:  # between steps the parameters are the inner steps', not a guess
            return []
        if final or holding or self._resync.discarding or not self.config.weight_prediction or kind != "sgd":
            return []
        return [SiteUpdate(it, layer, OWN_IN_FLIGHT, own[(it, layer)]) for it, layer in sorted(own)]

    def _poll(self, timeout: float, *, block: bool = False) -> None:
        """Handle the next event (block) or every event already queued (no block)."""
        assert self._link is not None and self._tracker is not None and self._resync is not None
        while True:
            event = self._link.get(timeout if block else 0.0)
            if event is None:
                return
            if isinstance(event, UpdateArrived):
                update = site_update(event, self._params, self.gateway)  # checked against the model
                self._tracker.arrived(event.iteration, event.layer, update)
            elif isinstance(event, ConfigChange):
                self._announced.append(event)
            else:  # a parameter resync's events
                self._resync.on_event(event)
            if block:
                return

    def _apply(self, decision: SiteDecision) -> None:
        """Every rank: average each summed update over its contributing sites and apply it sparsely."""
        assert self._optimizer is not None and self._resync is not None
        self._prediction.restore(self._params)  # the job's parameters, exactly, before its updates
        self.last_step_discarded = decision.discarded
        self.discarded_steps += int(decision.discarded)
        if decision.snapshot:
            self._resync.install()
            self.resyncs += 1
        self._applier.apply(decision.updates, self._params, self._optimizer)
        self._settings.schedule(decision.config_changes)

    def _switch_config(self) -> None:
        """Every rank, at a WAN iteration's start: the changes due take effect (:class:`SettingsInForce`)."""
        restart = self._settings.switch(self._iteration, self._compressor, self._optimizer)
        if restart is not None and restart.restart is not None:  # KILL_RESTART (AntDT §V-E3)
            carry_out_restart(
                restart.restart, rank=self.rank, site=self.site, iteration=self._iteration,
                config=self.config, close=self.close,
            )  # fmt: skip

    # -- checkpoint and resume ---------------------------------------------------------------------------

    def optimizer_state(self) -> dict[str, Any]:
        """What ``SparseOptimizer.state_dict()`` returns: the optimizer kernel's per-parameter state and
        your ``lr``, the live ``lr_scale``, density, staleness, local steps and batch weight in force, the
        iteration, and (site leader) the error-feedback residuals and compressor thresholds. Take it where
        no update is in flight — after ``ctx.close()`` (which applies every outstanding update), or at
        staleness 0 between steps — so a run resumed from it continues exactly where this one stopped."""
        if self._optimizer is None:
            raise LocalProtocolError("no optimizer bound to this context yet")
        check_checkpointable(
            self._iteration,
            micro=self._micro,
            resync_pending=self._resync is not None and self._resync.pending,
            in_flight=[] if self._closed or self._tracker is None else self._tracker.outstanding(),
        )
        return checkpoint_state(self._iteration, self._optimizer, self._settings, self._compressor)

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        """``SparseOptimizer.load_state_dict()``: restore :meth:`optimizer_state`'s output. The run must
        continue at the checkpoint's iteration (``wanrt.init(..., resume_at=state["iteration"])``: the
        gateways let it in only there), before its first step."""
        if self._optimizer is None:
            raise LocalProtocolError("no optimizer bound to this context yet")
        state = check_checkpoint(state, self._iteration)
        if self._began_training():
            raise LocalProtocolError("load_state_dict() after training began: load before the first step")
        restore_checkpoint(state, self._optimizer, self._settings, self._compressor)
        if self._reducer is not None:
            self._reducer.hold = self._holding()

    def _began_training(self) -> bool:
        start = self._resume_at if self._resume_at is not None else 0
        inner = 0 if self._outer is None else self._outer.inner
        return self._iteration != start or self._micro != 0 or inner != 0

    # -- the tensor API ----------------------------------------------------------------------------------

    def register_tensors(self, tensors: Mapping[str, torch.Tensor | tuple[int, ...]]) -> None:
        """Collective, once: the tensors :meth:`all_reduce` averages, by name and shape (a tensor or a
        shape): the job's signature, checked across sites (wanrt/client/tensor_api.py)."""
        from wanrt.client.tensor_api import TensorAverager

        if self._tensors is not None:
            raise LocalProtocolError("register_tensors() was called already on this context")
        self._tensors = TensorAverager(self, tensors)

    def all_reduce(self, name: str, tensor: torch.Tensor, op: str = "mean") -> torch.Tensor:
        """Collective: the average of ``tensor`` over every site and rank, through the gateways."""
        return self.all_reduce_async(name, tensor, op).wait()

    def all_reduce_async(self, name: str, tensor: torch.Tensor, op: str = "mean") -> AllReduceHandle:
        """:meth:`all_reduce` started (the push leaves now); ``handle.wait()`` collects the average."""
        if self._tensors is None:
            raise UnknownTensor(name, [])
        return self._tensors.start(name, tensor, op)

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
        if self._outer is not None:  # DiLoCo puts the job's parameters back (its anchor)
            self._outer.closing()
        self._prediction.restore(self._params)  # also after a failed step: leave the job's parameters
        try:
            if self._micro and self._broken is None:
                log.warning(
                    "close() after %d of %d micro-steps of iteration %d: their accumulated gradients are "
                    "not sent",
                    self._micro,
                    self.config.local_steps,
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
                self._link.close(self.config.close_timeout_s)
            if self._owns_group and dist.is_initialized():
                # a process group left to the interpreter's exit can abort it ("terminate called without
                # an active exception", gloo's threads); one the user created stays theirs to end
                dist.destroy_process_group()

    def leave_at_exit(self) -> None:
        """The leader's non-collective part of :meth:`close`, for a context left open at interpreter exit
        (wanrt/client/unclosed.py): finish the pushes handed to the worker, flush the link and say Bye, so
        no other site waits for them. Every failure is swallowed: the process is exiting anyway."""
        if not self._closed:
            self._closed = True
            leave_quietly(self._pipeline, self._link, self.config.close_timeout_s)

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
