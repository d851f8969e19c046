"""The recipe of one convergence probe (Algorithm 1's TESTRUN, StellaTrain §4.3): model width, learning
rate, sample budget, compressor and what the probe measures.

The recipe is part of a profile's configuration (``[profile.probe]``, :class:`~scheduler.profile.config.
ProfileConfig`), so it lives with the scheduler; the probe that trains the demo's model with it is the
demo's (:class:`wanrt.demo.digits_probe.DigitsProbe`), one floor up.
"""

from __future__ import annotations

from dataclasses import dataclass

from wanrt.config import check
from wanrt.kernels.compressors import COMPRESSOR_KINDS

__all__ = ["ProbeSettings"]


@dataclass(frozen=True)
class ProbeSettings:
    """One probe's recipe; every probe of a profile uses the same one (only r, x and s vary)."""

    #: width of the MLP's hidden layers (``wanrt.demo.model.build_mlp``)
    hidden: int = 128
    #: SGD learning rate, the same for every batch size (Algorithm 1 keeps the optimiser fixed). The demo's
    #: 0.3 is stable at its batch of 192 but makes batch-8 probes chaotic (final losses jumping between
    #: neighbouring r); at 0.1 the measured g is smooth and monotone in r and Σx
    lr: float = 0.1
    #: training samples per probe; with digits' 1437 training images, 8 epochs
    samples: int = 11496
    seed: int = 0
    compressor: str = "threshold_v_block"
    #: what a probe returns: ``loss`` — the training loss after ``samples`` (Algorithm 1's measure);
    #: ``samples_to_target`` — the samples until the training-split loss first falls to ``target_loss``
    #: (checked every ``eval_every`` steps; capped at ``samples``, beyond which the count is extrapolated as
    #: cap × final loss / target). The second makes 1 + ḡ the ratio of samples to the target, which is what
    #: Eq. 5's time to accuracy divides progress by; a loss ratio after a fixed budget overstates small
    #: batches once the loss falls geometrically (docs/demo.md, "A profile of the demo's own workload")
    measure: str = "loss"
    target_loss: float = 0.1
    eval_every: int = 5

    def __post_init__(self) -> None:
        check(1 <= self.hidden <= 8192, "hidden", self.hidden, "must be in 1..8192")
        check(0 < self.lr <= 10, "lr", self.lr, "must be in (0, 10]")
        check(1 <= self.samples <= 10_000_000, "samples", self.samples, "must be in 1..1e7")
        check(0 <= self.seed < 2**31, "seed", self.seed, "must be in 0..2**31-1")
        check(
            self.compressor in COMPRESSOR_KINDS, "compressor", self.compressor, f"one of {COMPRESSOR_KINDS}"
        )
        check(
            self.measure in ("loss", "samples_to_target"),
            "measure",
            self.measure,
            "one of 'loss', 'samples_to_target'",
        )
        check(0 < self.target_loss < 100, "target_loss", self.target_loss, "must be in (0, 100)")
        check(1 <= self.eval_every <= 10_000, "eval_every", self.eval_every, "must be in 1..10000")
