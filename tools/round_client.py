"""The client arm of ``tools/bench_round.py``: rounds timed through the public trainer client.

A trainer process per site (in its namespace) runs what a user runs: ``wanrt.init`` + ``SparseOptimizer``
on a model of one ``elements``-long fp32 parameter, and per round ``loss.backward(); opt.step()`` with
``staleness = 0`` (the step waits for this iteration's global update, so a step is a whole round). The
gradient is fixed per site (standard normal: ``loss = <w, g>``), so backward is autograd's own minimal
work and the step is the client's. Every round starts at one instant at every site (as the gateway rows'
pushes do); the round is the last ``step()`` return minus the first backward start.

Where the step's time goes: the client's own methods are wrapped (wall seconds summed per round, in the
thread that runs them), one stage per part of the data path:

========  ======================================================================================
hooks     the gradient hook's work on the training thread (``LayerReducer._issue``: issue the
          in-site reduce, hand the layer to the leader's worker)
reduce    the leader's wait for the in-site reduce (``work.wait()``; nothing at one rank per site)
site mean scaling the site's sum to its weighted mean (``LeaderPush.site_mean``)
compress  error feedback + selection (``LayerCompressor.compress``; dense: building the payload)
encode    wire cast and push cut (``GatewayLink.push``) + framing and codec (``Connection.send_parts``)
push      the link thread writing the push to the gateway's socket (``StreamTransport.send`` of pushes)
wait      the training thread blocked for the update (``Context._poll(block=True)``)
decode    the link thread parsing and decoding the update (``Connection.next_event``)
apply     averaging and applying the update (``Context._apply``)
========  ======================================================================================

``backward`` (``loss.backward()`` including the hooks) and ``step`` (``opt.step()``) are timed around the
user's calls. Stages in other threads overlap the training thread's: they do not add up to the round.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

#: stage name -> (module path, class name, method name); see the module docstring
STAGES: tuple[tuple[str, str, str, str], ...] = (
    ("hooks", "wanrt.client.site.grad_reduce", "LayerReducer", "_issue"),
    ("site mean", "wanrt.client.leader.push_path", "LeaderPush", "site_mean"),
    ("compress", "wanrt.client.leader.compression", "LayerCompressor", "compress"),
    ("encode", "wanrt.client.link.gateway_link", "GatewayLink", "push"),
    ("encode", "wanrt.protocol.connection", "Connection", "send_parts"),
    ("decode", "wanrt.protocol.connection", "Connection", "next_event"),
    ("apply", "wanrt.client.context", "Context", "_apply"),
)
STAGE_ORDER = ("hooks", "reduce", "site mean", "compress", "encode", "push", "wait", "decode", "apply")


class Spans:
    """Wall seconds per stage, summed until :meth:`take`; thread-safe (stages run in three threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sums: dict[str, float] = defaultdict(float)
        self._marks: dict[str, tuple[float, float]] = {}
        self._depth = threading.local()

    def add(self, stage: str, seconds: float) -> None:
        with self._lock:
            self._sums[stage] += seconds

    def wrap(self, owner: Any, name: str, stage: str, when: Callable[..., bool] | None = None) -> None:
        fn = getattr(owner, name)
        spans = self

        def timed(*a: Any, **kw: Any) -> Any:
            if when is not None and not when(*a, **kw):
                return fn(*a, **kw)
            # a stage that calls itself (or another wrap of the same stage) is counted once
            key = f"d_{stage}"
            depth = getattr(spans._depth, key, 0)
            setattr(spans._depth, key, depth + 1)
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                setattr(spans._depth, key, depth)
                if depth == 0:
                    spans.add(stage, time.perf_counter() - t0)

        setattr(owner, name, timed)

    def wrap_async(self, owner: Any, name: str, stage: str) -> None:
        fn = getattr(owner, name)
        spans = self

        async def timed(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await fn(*a, **kw)
            finally:
                spans.add(stage, time.perf_counter() - t0)

        setattr(owner, name, timed)

    def mark(self, name: str, at: float) -> None:
        """The first and last time ``name`` happened this round (monotonic seconds)."""
        with self._lock:
            first, _ = self._marks.get(name, (at, at))
            self._marks[name] = (first, at)

    def take(self) -> dict[str, float]:
        with self._lock:
            out = {s: self._sums.get(s, 0.0) for s in STAGE_ORDER}
            self._sums.clear()
        return out

    def take_marks(self) -> dict[str, tuple[float, float]]:
        with self._lock:
            out = dict(self._marks)
            self._marks.clear()
        return out


def install_spans() -> Spans:
    """Wrap the client's methods (class attributes: every instance made afterwards is timed)."""
    import importlib

    from transports.stream import StreamTransport
    from wanrt.client.context import Context
    from wanrt.client.leader.push_path import LeaderPush

    spans = Spans()
    for stage, module, cls, meth in STAGES:
        spans.wrap(getattr(importlib.import_module(module), cls), meth, stage)
    spans.wrap(Context, "_poll", "wait", when=lambda *a, **kw: bool(kw.get("block")))

    # the in-site reduce's wait: the job the leader's worker runs starts with it
    orig_cp = LeaderPush.compress_and_push

    def compress_and_push(self: Any, iteration: int, layer: int, work: Any, grad: Any) -> None:
        if work is not None:
            t0 = time.perf_counter()
            work.wait()
            spans.add("reduce", time.perf_counter() - t0)
        orig_cp(self, iteration, layer, None, grad)

    LeaderPush.compress_and_push = compress_and_push  # type: ignore[method-assign]
    # the push on the trainer's socket: only the link's writer task sends from the loop thread's
    # writer; heartbeats and acks are tiny and counted too (they share the socket)
    spans.wrap_async(StreamTransport, "send", "push")
    _install_marks(spans)
    return spans


#: timeline marks (first and last time per round): (mark, module, class, method, stamped at the call's start)
MARKS: tuple[tuple[str, str, str, str, bool], ...] = (
    ("push write", "transports.stream", "StreamTransport", "send", True),
    ("piece in", "wanrt.client.link.result_streams", "ResultStreams", "piece", False),
    ("result end", "wanrt.client.link.result_streams", "ResultStreams", "end", False),
    ("apply start", "wanrt.client.context", "Context", "_apply", True),
    ("apply end", "wanrt.client.context", "Context", "_apply", False),
)


def _install_marks(spans: Spans) -> None:
    """Timestamps of the round's milestones, so a round's excess over the gateways' can be placed: from the
    backward's start to the first push bytes written, and from the last result piece to ``step()``'s end."""
    import asyncio
    import importlib

    for mark, module, cls, meth, at_start in MARKS:
        owner = getattr(importlib.import_module(module), cls)
        fn = getattr(owner, meth)

        def wrapped(*a: Any, _fn: Any = fn, _mark: str = mark, _start: bool = at_start, **kw: Any) -> Any:
            if _start:
                spans.mark(_mark, time.monotonic())
            out = _fn(*a, **kw)
            if not _start:
                spans.mark(_mark, time.monotonic())
            return out

        async def awrapped(*a: Any, _fn: Any = fn, _mark: str = mark, **kw: Any) -> Any:
            spans.mark(_mark, time.monotonic())
            return await _fn(*a, **kw)

        setattr(owner, meth, awrapped if asyncio.iscoroutinefunction(fn) else wrapped)


def run(url: str, site: str, secret_file: str, elements: int, density: float, wire: str, work: str) -> int:
    """One site's trainer: commands on stdin (JSON lines), one JSON reply each on stdout."""
    import torch
    import torch.distributed as dist

    spans = install_spans()
    import wanrt
    from wanrt.client import ClientConfig, SparseOptimizer

    torch.set_num_threads(1)
    store = Path(work) / f"client-store-{site}-{os.getpid()}"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    cfg = ClientConfig(
        density=density,
        wire_dtype=wire,  # type: ignore[arg-type]
        staleness=0,  # the step waits for its own round: a step is a whole round
        error_feedback=density < 1.0,
        update_deadline_s=300.0,
    )
    ctx = wanrt.init(url, site=site, job="bench-round", secret_file=secret_file, config=cfg)
    w = torch.nn.Parameter(torch.zeros(elements, dtype=torch.float32))
    opt = SparseOptimizer([("w", w)], "sgd", lr=1e-3, ctx=ctx)
    rng = np.random.default_rng(7 + ord(site[0]))
    g = torch.from_numpy(rng.standard_normal(elements).astype(np.float32))

    def reply(obj: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    reply({"event": "ready"})
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "step":
            spans.take()
            spans.take_marks()  # what happened between rounds (acks, heartbeats) is no milestone of this one
            delay = cmd["at"] - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # every site starts at one instant (the bench's own start, not a race)
            t0 = time.monotonic()
            loss = torch.dot(w, g)
            loss.backward()
            t1 = time.monotonic()
            opt.step()
            t2 = time.monotonic()
            opt.zero_grad()
            stages = spans.take()
            stages["backward"] = t1 - t0
            stages["step"] = t2 - t1
            marks = {"backward end": (t1, t1), **spans.take_marks()}
            reply({"event": "step", "t_start": t0, "t_end": t2, "stages": stages, "marks": marks})
        elif op == "check":
            digest = hashlib.blake2b(w.detach().numpy().tobytes(), digest_size=8).hexdigest()
            from wanrt.codec.kernel_choice import fused_loader

            fused = fused_loader().ready() is not None  # the codec's fused kernels (else NumPy's) ran
            reply({"event": "check", "digest": digest, "iteration": ctx.iteration, "fused_codec": fused})
        elif op == "quit":
            break
    ctx.close()
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0
