"""The body of one demo trainer process (started with multiprocessing's *spawn*), up to the training loop.

It first points its stdout/stderr (the file descriptors, so native crashes and faulthandler dumps land there
too) at its own log file and pins the thread pools to one thread (S × R trainers share the machine's cores;
more threads only add contention), and only then imports torch. It joins its site's gloo process group
(file:// rendezvous in the run's temp dir, loopback only), receives the dataset, and then serves the
parent's orders: one :class:`~wanrt.demo.trainers.messages.RunOrder` per run, the same process for the
dense and the wanrt run, so each run's clock starts with warm, connected trainers. Any error is written to
the log with its traceback and sent to the parent as :class:`~wanrt.demo.trainers.messages.Failed`, and
the process exits 1.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from wanrt.demo.trainers.messages import Exit, Failed, RunOrder
from wanrt.demo.trainers.stop_control import StopControl
from wanrt.demo.workload.data import DigitsSplit

__all__ = ["TrainerSpec", "trainer_main"]

#: environment every trainer runs with: one compute thread, gloo on loopback only
TRAINER_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "NUMBA_NUM_THREADS": "1",
    "GLOO_SOCKET_IFNAME": "lo",
}


@dataclass(frozen=True)
class TrainerSpec:
    """Everything one trainer needs besides the per-run orders."""

    site: str
    site_index: int
    rank: int
    ranks: int
    sites: int
    store: Path
    log: Path
    secret_file: Path
    hidden: int
    seed: int
    batch: int
    lr: float
    optimizer: str
    #: this rank computes the training-split loss (every ``RunOrder.eval_every`` iterations)
    evaluator: bool
    #: ``cpu`` or ``cuda`` (DemoConfig.device): with CUDA, rank r of every site uses GPU r
    device: str = "cpu"

    @property
    def name(self) -> str:
        return f"trainer {self.site}/{self.rank}"

    @property
    def global_rank(self) -> int:
        return self.site_index * self.ranks + self.rank

    @property
    def world(self) -> int:
        return self.sites * self.ranks


def _redirect_output(log: Path) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    faulthandler.enable()


def trainer_main(spec: TrainerSpec, conn: Connection, stops: StopControl) -> None:
    """Process entry point (see the module docstring)."""
    # Ctrl-C in a terminal reaches the whole process group; the parent answers it by stopping every child
    # in order, so a trainer does not die mid-collective with a traceback of its own
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _redirect_output(spec.log)
    os.environ.update(TRAINER_ENV)
    try:
        from wanrt.demo.trainers.training_loop import Trainer

        data = conn.recv()  # the parent loads the dataset once (scikit-learn is slow to import) and ships it
        if not isinstance(data, DigitsSplit):
            raise TypeError(f"expected the dataset first, got {type(data).__name__}")
        trainer = Trainer(spec, conn, stops, data)
        while True:
            order = conn.recv()
            if isinstance(order, Exit):
                break
            if not isinstance(order, RunOrder):
                raise TypeError(f"unexpected order {order!r}")
            trainer.run(order)
        trainer.shutdown()
    except BaseException as exc:
        traceback.print_exc()
        sys.stderr.flush()
        # if the parent is gone or closed the pipe, it is tearing the run down anyway
        with contextlib.suppress(OSError, ValueError):
            conn.send(Failed(spec.site_index, spec.rank, f"{type(exc).__name__}: {exc}"))
        sys.exit(1)
