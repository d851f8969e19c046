"""Algorithm 1's TESTRUN: a short training run of the demo model in one process, compressed as wanrt would.

StellaTrain §4.3 defines the convergence penalty ``g(r, x)`` as the relative difference in training loss after
a fixed amount of probe training (half an epoch of ImageNet there) at total batch ``x``, with compression
rate ``r`` and staleness, against a run with neither. Here the model is the demo's MLP on scikit-learn's
digits (``wanrt.demo.workload``: model and data), which is why the probe is the demo's (the top floor) and
only its recipe, :class:`~scheduler.profile.probe_settings.ProbeSettings`, is the scheduler's; the run is one
process, no gateways — the whole
job as one worker whose batch is the total batch ``x``, which is what the sites' aggregated gradient is:

* every step's gradient goes, layer by layer, through the project's real compressor (cache-aware
  threshold-v on 16-float blocks by default) with error feedback (``wanrt.kernels.ErrorFeedback``) at
  density ``1 − r``, and is applied by the project's sparse SGD (``r = 0``: the dense gradient, plain SGD);
* staleness ``s`` is emulated by applying, at step ``n``, the update computed at step ``n − s`` (Alg. 1
  line 4–5: the gradient of ``θ_{n−s}`` updates ``θ_n``);
* the budget is a fixed number of *samples*, so a larger batch takes fewer steps — that is the batch side
  of ``g``;
* the result is the loss on the whole training split after the budget. Algorithm 1 returns an EMA (0.99)
  of the minibatch loss instead; with the few dozen steps a large-batch probe takes here, such an EMA
  would still be dominated by its first values, so we measure the end point directly (and deterministically:
  the same seed gives the same initial weights and the same sample stream for every probe).
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np

from scheduler.profile.probe_settings import ProbeSettings
from wanrt.config import check

if TYPE_CHECKING:
    from wanrt.demo.workload.data import DigitsSplit

__all__ = ["DigitsProbe"]


class DigitsProbe:
    """Runs probes of one recipe; loads the data once (scikit-learn's loader costs a second or two)."""

    def __init__(self, settings: ProbeSettings, data: DigitsSplit | None = None) -> None:
        from wanrt.demo.workload.data import load_split

        self.settings = settings
        self.data = data if data is not None else load_split(settings.seed)
        self.runs = 0

    def describe(self) -> dict[str, Any]:
        """What the profile file records about how its points were measured."""
        s = self.settings
        return {
            "model": "wanrt.demo.model.build_mlp (digits)",
            "hidden": s.hidden,
            "lr": s.lr,
            "samples": s.samples,
            "seed": s.seed,
            "compressor": s.compressor,
            "optimizer": "sgd",
            "loss": "cross-entropy on the whole training split after the sample budget"
            if s.measure == "loss"
            else f"samples until the training-split cross-entropy <= {s.target_loss:g} (per 1000)",
            "measure": s.measure,
        }

    def loss(self, r: float, total_batch: int, staleness: int) -> float:
        """Training loss after ``samples`` samples at compression ``r``, batch ``total_batch``, staleness."""
        import torch

        from wanrt.demo.workload.model import build_mlp, evaluate
        from wanrt.kernels import ErrorFeedback, make_compressor, make_sparse_optimizer

        check(0.0 <= r < 1.0, "r", r, "must be in [0, 1)")
        check(isinstance(total_batch, int) and total_batch >= 1, "total_batch", total_batch, "must be >= 1")
        check(staleness in (0, 1), "staleness", staleness, "must be 0 or 1")
        s = self.settings
        self.runs += 1
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # tiny matrices: threads only add overhead (and the machine is shared)
        try:
            model = build_mlp(s.hidden, s.seed)
            params = list(model.parameters())
            flat = [p.data.view(-1).numpy() for p in params]
            x_all, y_all, _, _ = self.data.tensors()
            gen = torch.Generator().manual_seed(s.seed)
            dense = r == 0.0
            comp = None if dense else make_compressor(s.compressor, density=1.0 - r)
            ef = ErrorFeedback()
            opt = make_sparse_optimizer("sgd", lr=s.lr)
            pending: deque[list[Any]] = deque()
            steps = math.ceil(s.samples / total_batch)
            to_target = s.measure == "samples_to_target"
            for step in range(steps):
                if to_target and step % s.eval_every == 0 and step > 0:
                    now, _ = evaluate(model, x_all, y_all)
                    if now <= s.target_loss:
                        return step * total_batch / 1000.0
                    if not math.isfinite(now):
                        return float("inf")
                pick = torch.randint(len(y_all), (total_batch,), generator=gen)
                loss = torch.nn.functional.cross_entropy(model(x_all[pick]), y_all[pick])
                grads = torch.autograd.grad(loss, params)
                if not math.isfinite(float(loss.detach())):
                    break  # diverged: the final loss below says so
                if dense:
                    pending.append([g.detach().reshape(-1).clone() for g in grads])
                else:
                    assert comp is not None
                    pending.append(
                        [ef.compress(j, g.detach().reshape(-1).numpy(), comp) for j, g in enumerate(grads)]
                    )
                if len(pending) > staleness:
                    self._apply(pending.popleft(), params, flat, opt, dense)
            final, _ = evaluate(model, x_all, y_all)
        finally:
            torch.set_num_threads(threads)
        if not math.isfinite(final):
            return float("inf")
        if to_target:
            done = steps * total_batch
            return (done if final <= s.target_loss else done * final / s.target_loss) / 1000.0
        return final

    def _apply(self, update: list[Any], params: list[Any], flat: list[Any], opt: Any, dense: bool) -> None:
        if dense:
            for p, u in zip(params, update, strict=True):
                p.data.view(-1).sub_(u, alpha=self.settings.lr)
        else:
            for j, payload in enumerate(update):
                opt.step(j, flat[j], payload)

    @staticmethod
    def relative(loss: float, baseline: float) -> float:
        """g = (L − L_base) / L_base (§4.3)."""
        return (loss - baseline) / baseline if np.isfinite(loss) else float("inf")
