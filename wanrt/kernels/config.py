"""Frozen tuning constants of the compressors and the hyperparameters of the sparse optimizers.

Every knob that changes what a kernel computes lives here, validated on construction with
:func:`wanrt.config.check`, so a TOML file (``[kernels.compressor]``) or a constructor call with a bad value
fails loudly, naming the key, instead of silently producing a different payload.
"""

from __future__ import annotations

from dataclasses import dataclass

from wanrt.config import check

__all__ = [
    "MAX_BLOCK_SIZE",
    "AdamConfig",
    "CompressorConfig",
    "MomentumConfig",
    "SGDConfig",
]

#: Largest block the kernels accept. 4096 fp32 = 16 KiB, a quarter of a typical L1+L2 working set; larger
#: "blocks" stop being cache lines and become a different (layer-chunk) compressor.
MAX_BLOCK_SIZE = 4096


@dataclass(frozen=True)
class CompressorConfig:
    """Constants of threshold-v selection (StellaTrain §3.2) and of the baselines.

    The AIMD controller (see :mod:`wanrt.kernels.aimd`) aims the number of blocks that pass ``v`` at
    ``(1 + headroom) * k_block`` and the payload keeps the largest ``cap_factor * k_block`` of them, so the
    WAN payload size is predictable even while ``v`` is still settling.
    """

    #: the controller aims the pass count this fraction above k_block, so that a small drift of the gradient
    #: scale between steps still leaves at least k_block blocks to choose from
    headroom: float = 0.25
    #: hard cap on the payload, in units of k_block; when more blocks pass, the largest are kept
    cap_factor: float = 1.0
    #: candidate buffer in units of the aim; more passing blocks than this trigger one exact re-selection
    #: pass (a bounded, rare cost) instead of an unbounded buffer
    buffer_factor: float = 4.0
    #: a step whose pass count falls below this fraction of k_block selects again, exactly (the second
    #: pass of the safety net), so the payload carries the density the scheduler sized to the WAN (±25 %
    #: by default) even when the block-sum tail is a cliff that no threshold predicted from the last step
    #: can hit (error feedback on a steady gradient; docs/kernels.md, "Holding the density")
    fill_floor: float = 0.75
    #: smallest multiplicative-decrease factor of v in one step (how fast v may fall when too few pass)
    md_floor: float = 0.5
    #: largest multiplicative-decrease factor (a decrease is always at least this strong)
    md_ceiling: float = 0.98
    #: ratio above the aim threshold at which the local steepness of the block-sum tail is probed
    probe_ratio: float = 1.05
    #: EWMA weight of the trend (per-step log-change of the threshold) and of its prediction error
    trend_weight: float = 0.5
    #: fraction of the smoothed trend applied to the next v (< 1: a decelerating drift is not overshot)
    trend_damping: float = 0.9
    #: the next v sits this many standard deviations of the prediction error below the prediction, so a
    #: volatile layer passes more candidates (still trimmed to the cap) instead of falling short
    margin_sigmas: float = 2.0
    #: blocks sampled to estimate the first v of a layer (a partial selection, §3.2 leaves it open)
    sample_blocks: int = 4096
    #: if the aim's rank inside the sample is below this, the first step selects exactly instead
    min_sample_rank: int = 8
    #: seed of the first-v sampling and of random-k (each layer derives its own stream from it)
    seed: int = 0

    def __post_init__(self) -> None:
        check(0.0 <= self.headroom <= 4.0, "headroom", self.headroom, "must be in [0, 4]")
        check(1.0 <= self.cap_factor <= 16.0, "cap_factor", self.cap_factor, "must be in [1, 16]")
        check(0.0 <= self.fill_floor <= 1.0, "fill_floor", self.fill_floor, "must be in [0, 1]")
        check(1.0 <= self.buffer_factor <= 64.0, "buffer_factor", self.buffer_factor, "must be in [1, 64]")
        check(0.0 < self.md_floor < 1.0, "md_floor", self.md_floor, "must be in (0, 1)")
        check(
            self.md_floor <= self.md_ceiling < 1.0,
            "md_ceiling",
            self.md_ceiling,
            "must be in [md_floor, 1)",
        )
        check(1.0 < self.probe_ratio <= 2.0, "probe_ratio", self.probe_ratio, "must be in (1, 2]")
        check(0.0 <= self.trend_weight <= 1.0, "trend_weight", self.trend_weight, "must be in [0, 1]")
        check(0.0 <= self.trend_damping <= 1.0, "trend_damping", self.trend_damping, "must be in [0, 1]")
        check(0.0 <= self.margin_sigmas <= 10.0, "margin_sigmas", self.margin_sigmas, "must be in [0, 10]")
        check(self.sample_blocks >= 16, "sample_blocks", self.sample_blocks, "must be >= 16")
        check(self.min_sample_rank >= 1, "min_sample_rank", self.min_sample_rank, "must be >= 1")
        check(self.seed >= 0, "seed", self.seed, "must be >= 0")


def _check_lr_wd(lr: float, weight_decay: float) -> None:
    check(lr >= 0.0, "lr", lr, "must be >= 0")
    check(weight_decay >= 0.0, "weight_decay", weight_decay, "must be >= 0")


@dataclass(frozen=True)
class SGDConfig:
    """Plain SGD, ``torch.optim.SGD(momentum=0)`` semantics on the touched elements."""

    lr: float = 0.01
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        _check_lr_wd(self.lr, self.weight_decay)


@dataclass(frozen=True)
class MomentumConfig:
    """SGD with (lazy) momentum, ``torch.optim.SGD`` semantics on the touched blocks."""

    lr: float = 0.01
    momentum: float = 0.9
    dampening: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        _check_lr_wd(self.lr, self.weight_decay)
        check(0.0 <= self.momentum < 1.0, "momentum", self.momentum, "must be in [0, 1)")
        check(0.0 <= self.dampening <= 1.0, "dampening", self.dampening, "must be in [0, 1]")
        check(
            not self.nesterov or (self.momentum > 0 and self.dampening == 0),
            "nesterov",
            self.nesterov,
            "needs momentum > 0 and dampening == 0 (as in torch.optim.SGD)",
        )


@dataclass(frozen=True)
class AdamConfig:
    """Adam / AdamW (lazy), ``torch.optim.Adam``/``AdamW`` semantics on the touched blocks.

    ``decoupled`` selects AdamW (weight decay applied to the parameter, not added to the gradient).
    """

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    decoupled: bool = False

    def __post_init__(self) -> None:
        _check_lr_wd(self.lr, self.weight_decay)
        check(len(self.betas) == 2, "betas", self.betas, "must be a pair (beta1, beta2)")
        b1, b2 = self.betas
        check(0.0 <= b1 < 1.0, "betas", self.betas, "beta1 must be in [0, 1)")
        check(0.0 <= b2 < 1.0, "betas", self.betas, "beta2 must be in [0, 1)")
        check(self.eps > 0.0, "eps", self.eps, "must be > 0")
