#!/usr/bin/env python3
"""A trainer process for the shard tests and benchmark: the real client link and ShardSampler against a
real gateway, with "compute" replaced by a sleep (what is measured is which samples were trained).

``python tools/shard_trainer.py URL SITE N BATCH [--epochs E] [--hang-after K]`` prints one JSON line
per finished step (``{"step": i, "indices": [...]}``) after reporting it, and ``{"finished": epoch}`` once
it has made its passes through E data epochs (a ``finished`` / ``drained`` grant ends one pass); with
``--hang-after K`` it stops after K steps mid-epoch,
holding its shards, until it is killed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from wanrt.client.config import ClientConfig
from wanrt.client.link.api import LinkSpec
from wanrt.client.link.gateway_link import open_gateway_link
from wanrt.client.link.signature import LayerSignature
from wanrt.client.shard_sampler import ShardSampler

JOB = "testjob"
SECRET = b"s3cret-s3cret-s3cret"  # the test clusters' job secret (tools.harness.daemon_cluster)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("site")
    ap.add_argument("n", type=int)
    ap.add_argument("batch", type=int)
    ap.add_argument("--hang-after", type=int, default=-1)
    ap.add_argument("--step-s", type=float, default=0.0)
    ap.add_argument("--epochs", type=int, default=1, help="data epochs the job trains")
    a = ap.parse_args(argv)
    sig = LayerSignature.of(["w"], [(4,)], ["float32"])
    link = open_gateway_link(LinkSpec(a.url, a.site, JOB, SECRET, sig, ClientConfig()))
    sampler = ShardSampler(link, a.n, want=1, retry_s=0.05, timeout_s=30.0)
    step = 0
    batch: list[int] = []

    def finish_step() -> None:
        nonlocal step, batch
        time.sleep(a.step_s)  # "compute"
        sampler.step_done(len(batch))
        print(json.dumps({"step": step, "indices": batch}), flush=True)
        step, batch = step + 1, []
        if step == a.hang_after:
            while True:
                time.sleep(1.0)  # mid-epoch, holding its shards: the test kills it

    # a training loop knows how many epochs it trains: "finished" / "drained" end one epoch's pass only
    while sampler.epoch < a.epochs:
        for index in sampler:
            batch.append(index)
            if len(batch) == a.batch:
                finish_step()
        if batch:
            finish_step()
    print(json.dumps({"finished": sampler.epoch, "granted": sampler.granted}), flush=True)
    link.close(5.0)
    return 0


class TrainerProcess:
    """The parent's side (tests, tools/bench_shard_daemons.py): one trainer process running this file and
    the index lists of the steps it reported."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.steps: list[list[int]] = []
        self.finished: dict[str, Any] | None = None

    @classmethod
    async def start(cls, url: str, site: str, n: int, batch: int, *extra: str) -> TrainerProcess:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(Path(__file__).resolve()),
            url,
            site,
            str(n),
            str(batch),
            *extra,
            cwd=Path(__file__).resolve().parents[1],
            stdout=asyncio.subprocess.PIPE,
        )
        return cls(proc)

    async def read_steps(self, count: int | None = None) -> None:
        """Until ``count`` steps were reported (None: until the process says it finished)."""
        assert self.proc.stdout is not None
        while count is None or len(self.steps) < count:
            line = await self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"trainer exited early (rc={await self.proc.wait()})")
            rec = json.loads(line)
            if "finished" in rec:
                self.finished = rec
                if await self.proc.wait() != 0:
                    raise RuntimeError("trainer failed after finishing")
                return
            self.steps.append(rec["indices"])

    async def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()

    def samples(self) -> list[int]:
        return [i for s in self.steps for i in s]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
