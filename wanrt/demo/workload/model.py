"""The demo's model: a two-hidden-layer MLP on 8×8 digits, whose width sets how much a dense exchange moves.

``hidden`` is the knob: parameters ≈ 64·h + h² + 10·h, so the default 512 gives 0.30 M parameters (1.2 MB
of fp32 gradient per iteration, ~0.1 s per hop at 100 Mbit/s) while a forward/backward of a 32-sample
batch stays a few milliseconds on one core: communication, not compute, decides the dense run's speed.
Every rank builds it from the same seed, so all ranks of all sites start from identical parameters.
"""

from __future__ import annotations

import hashlib

import torch

from wanrt.demo.workload.data import CLASSES, FEATURES

__all__ = ["build_mlp", "evaluate", "n_parameters", "parameter_digest"]


def build_mlp(hidden: int, seed: int, *, features: int = FEATURES, classes: int = CLASSES) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(features, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, classes),
    )


def n_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) on ``x, y``."""
    with torch.no_grad():
        logits = model(x)
        loss = float(torch.nn.functional.cross_entropy(logits, y))
        acc = float((logits.argmax(dim=1) == y).float().mean())
    return loss, acc


def parameter_digest(model: torch.nn.Module) -> str:
    """A short hash of every parameter's bytes: equal digests = bit-identical models."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()[:16]
