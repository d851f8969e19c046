"""What the demo's parent and its trainer processes say to each other over one pipe per trainer.

Parent → trainer: :class:`RunOrder` (train one run against these gateways), :class:`Go` (start the clock:
every trainer of every site is connected), :class:`Exit`. Trainer → parent: :class:`Booted`, :class:`Ready`,
:class:`Progress` (site leaders, every iteration: feeds the progress bars), :class:`Evaluated` (one rank,
every ``eval_every`` iterations: the loss curve and the target check), :class:`Finished`, :class:`Failed`.
Plain frozen dataclasses: they are pickled by :mod:`multiprocessing` and carry no behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass

from wanrt.client.config import ClientConfig
from wanrt.demo.straggler import Slowdown

__all__ = [
    "Booted",
    "Evaluated",
    "Exit",
    "Failed",
    "Finished",
    "Go",
    "OuterSpec",
    "Progress",
    "Ready",
    "RunOrder",
    "TrainerMessage",
]


@dataclass(frozen=True)
class OuterSpec:
    """Train with ``wanrt.DiLoCo`` (the outer loop, docs/outer_loop.md): the demo optimizer's torch form as
    the inner optimizer, ``sync_every`` inner steps per outer step (a live ``outer_steps`` decision of the
    scheduler replaces it), DiLoCo §3's outer Nesterov step."""

    sync_every: int
    outer_lr: float
    outer_momentum: float
    #: Streaming DiLoCo's fragments P (1: plain DiLoCo)
    fragments: int = 1


@dataclass(frozen=True)
class RunOrder:
    run: str
    slot: int
    gateway_url: str
    job: str
    #: None: train on the local gradient alone, no wanrt and no gateway (the compute-only reference)
    client: ClientConfig | None
    #: the evaluating rank computes the training-split loss every this many iterations; 0 = never
    eval_every: int
    #: samples per rank and iteration at the start (None: the trainer's configured batch)
    batch: int | None = None
    #: this trainer's site is the run's straggler (``--straggler``): sleep this much per sample
    slowdown: Slowdown | None = None
    #: train with the outer loop (``--mode diloco|auto``); None: the per-step SparseOptimizer
    outer: OuterSpec | None = None


@dataclass(frozen=True)
class Go:
    pass


@dataclass(frozen=True)
class Exit:
    pass


@dataclass(frozen=True)
class Booted:
    site_index: int
    rank: int
    parameters: int


@dataclass(frozen=True)
class Ready:
    run: str
    site_index: int
    rank: int


@dataclass(frozen=True)
class Progress:
    run: str
    site_index: int
    rank: int
    iteration: int
    loss: float
    t: float
    #: samples this rank drew for that iteration (the scheduler may change it)
    batch: int = 0


@dataclass(frozen=True)
class Evaluated:
    run: str
    iteration: int
    train_loss: float
    test_accuracy: float
    #: time.monotonic() when the step that produced these parameters finished
    t: float


@dataclass(frozen=True)
class Finished:
    run: str
    site_index: int
    rank: int
    iterations: int
    #: time.monotonic() at the end of the last step, before the context's final exchange
    t_last_step: float
    final_loss: float
    final_accuracy: float
    digest: str
    #: the batch this rank drew for its last iteration, and the samples it trained on in all
    batch: int = 0
    samples: int = 0


@dataclass(frozen=True)
class Failed:
    site_index: int
    rank: int
    message: str


TrainerMessage = Booted | Ready | Progress | Evaluated | Finished | Failed
