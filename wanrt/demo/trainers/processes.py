"""The demo's trainer processes: S sites × R ranks, spawned once and reused for the dense and the wanrt run.

*spawn*, not fork: the parent may hold threads (tqdm's monitor, the test runner's), and forking a threaded
process is unsafe; the children import torch themselves. Each child gets one duplex pipe to the parent and
its process sentinel tells the parent at once when it exits. They are daemonic, so even if the parent dies
on an unexpected exception, multiprocessing's exit handler terminates them: no orphans. A run's stop is
orderly (:class:`~wanrt.demo.trainers.messages.Exit`, join), then terminate, then kill, always reaping.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnContext, SpawnProcess
from pathlib import Path
from typing import Final

from wanrt.demo.config import DemoConfig, site_names
from wanrt.demo.failures import DemoFailed
from wanrt.demo.trainers.entry import TrainerSpec, trainer_main
from wanrt.demo.trainers.messages import Exit
from wanrt.demo.trainers.stop_control import StopControl

__all__ = ["TrainerProcess", "start_trainers", "stop_trainers", "trainer_specs"]

#: an orderly exit is leaving the gloo group; beyond this the process is terminated
EXIT_TIMEOUT_S: Final = 15.0


class TrainerProcess:
    """One trainer child: its spec, its process and the parent's end of its pipe."""

    def __init__(self, spec: TrainerSpec, process: SpawnProcess, conn: Connection) -> None:
        self.spec = spec
        self.process = process
        self.conn = conn

    @property
    def name(self) -> str:
        return self.spec.name

    def failed(self, what: str) -> DemoFailed:
        code = self.process.exitcode
        status = "" if code is None else f" (exit code {code})"
        return DemoFailed(f"{self.name} {what}{status}", child=self.name, log=self.spec.log)


def trainer_specs(cfg: DemoConfig, *, out_dir: Path, store_dir: Path, secret_file: Path) -> list[TrainerSpec]:
    """One spec per (site, rank); the last rank of the first site evaluates (the leaders have more to do)."""
    specs = []
    for si, site in enumerate(site_names(cfg.sites)):
        for rank in range(cfg.ranks):
            specs.append(
                TrainerSpec(
                    site=site,
                    site_index=si,
                    rank=rank,
                    ranks=cfg.ranks,
                    sites=cfg.sites,
                    store=store_dir / f"dist-{site}.store",
                    log=out_dir / f"trainer-{site}{rank}.log",
                    secret_file=secret_file,
                    hidden=cfg.model_hidden,
                    seed=cfg.seed,
                    batch=cfg.batch,
                    lr=cfg.lr,
                    optimizer=cfg.optimizer,
                    evaluator=(si == 0 and rank == cfg.ranks - 1),
                    device=cfg.device,
                )
            )
    return specs


def start_trainers(
    mp: SpawnContext, specs: Sequence[TrainerSpec], stops: StopControl
) -> list[TrainerProcess]:
    """Spawn every trainer; on a failure part-way, the ones already started are stopped again."""
    out: list[TrainerProcess] = []
    try:
        for spec in specs:
            spec.store.unlink(missing_ok=True)
            parent_end, child_end = mp.Pipe(duplex=True)
            proc = mp.Process(target=trainer_main, args=(spec, child_end, stops), name=spec.name, daemon=True)
            proc.start()
            child_end.close()
            out.append(TrainerProcess(spec, proc, parent_end))
    except BaseException:
        stop_trainers(out)
        raise
    return out


def stop_trainers(trainers: Sequence[TrainerProcess], *, timeout_s: float = EXIT_TIMEOUT_S) -> None:
    """Ask every trainer to exit, wait, then terminate and finally kill what is left; reap all."""
    for t in trainers:
        if t.process.is_alive():
            with contextlib.suppress(OSError, ValueError):
                t.conn.send(Exit())
    deadline = time.monotonic() + timeout_s
    for t in trainers:
        t.process.join(max(0.0, deadline - time.monotonic()))
    for t in trainers:
        if t.process.is_alive():
            t.process.terminate()
            t.process.join(5.0)
        if t.process.is_alive():
            t.process.kill()
            t.process.join()
        t.conn.close()
