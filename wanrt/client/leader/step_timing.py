"""What a trainer measures per iteration for the scheduler: compute, idle, and where the time went.

StellaTrain §4.1 estimates the WAN bandwidth from the GPU idle rate: a GPU that waits for updates is
waiting for the network. On CPU (and as the portable measure everywhere) idle is the time the leader sits
blocked in ``step()`` waiting for updates it may not go without; the rest of the iteration is compute.
Forward and backward are split at the first gradient hook of the iteration (the forward pass ends
shortly before it), the optimizer is the time spent applying updates. Times are passed in (sans-IO).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StepTimer"]


@dataclass(slots=True)
class StepTimer:
    """One iteration's marks; :meth:`metrics` closes it and starts the next."""

    start: float | None = None  # end of the previous step (the iteration began)
    first_grad: float | None = None
    step_called: float | None = None
    idle: float = 0.0
    optimizer: float = 0.0

    def begin(self, now: float) -> None:
        self.start, self.first_grad, self.step_called = now, None, None
        self.idle = self.optimizer = 0.0

    def grad_ready(self, now: float) -> None:
        if self.first_grad is None:
            self.first_grad = now

    def step(self, now: float) -> None:
        self.step_called = now

    def waited(self, seconds: float) -> None:
        self.idle += max(0.0, seconds)

    def applied(self, seconds: float) -> None:
        self.optimizer += max(0.0, seconds)

    def bpt(self) -> float | None:
        """This iteration's batch processing time so far: its start to ``step()`` (forward, backward and
        whatever the loop did between; AntDT's BPT), None before the first full iteration."""
        if self.start is None or self.step_called is None:
            return None
        return max(0.0, self.step_called - self.start)

    def metrics(
        self,
        now: float,
        *,
        batch_size: int | None,
        world_size: int,
        local_steps: int = 1,
        inner_steps: int = 1,
    ) -> dict[str, float] | None:
        """The finished iteration's measurements (None for the first, which has no start), then begin
        the next one at ``now``.

        With ``local_steps`` k (ElasticBSP §4) an iteration is k micro-steps: ``compute_s`` stays the WAN
        iteration's (their sum), ``micro_step_s`` = compute_s / k is what a scheduler predicts micro-step
        ends with (ZipLine), and samples/s counts the k batches. An outer loop's round (DiLoCo, arXiv
        2311.08105: H inner optimizer steps per exchange) is ``inner_steps`` = H batches the same way:
        ``micro_step_s`` is then the time of one inner step (compute_s / H), reported with
        ``inner_steps``, so a round of H steps is never mistaken for one slow batch."""
        out: dict[str, float] | None = None
        if self.start is not None:
            total = max(now - self.start, 1e-9)
            step_at = self.step_called if self.step_called is not None else now
            grad_at = self.first_grad if self.first_grad is not None else step_at
            out = {
                "iteration_s": total,
                "idle_s": self.idle,
                "idle_frac": min(1.0, self.idle / total),
                "compute_s": max(0.0, total - self.idle),
                "forward_s": max(0.0, grad_at - self.start),
                "backward_s": max(0.0, step_at - grad_at),
                "optimizer_s": self.optimizer,
                "world_size": float(world_size),
                "local_steps": float(local_steps),
                "micro_step_s": max(0.0, total - self.idle) / (local_steps * inner_steps),
            }
            if inner_steps > 1:
                out["inner_steps"] = float(inner_steps)
            if batch_size is not None:
                out["batch_size"] = float(batch_size)
                out["samples_per_s"] = batch_size * world_size * local_steps * inner_steps / total
        self.begin(now)
        return out
