"""A diagnostic profile of a few steady iterations of one demo trainer (``WANRT_DEMO_PROFILE=DIR``).

Why: on a GPU the question "where does wanrt's overhead over compute-only go" (issue 26's
``gpu_comm_overhead_ratio``) has three parts that one profiler alone does not show: the device's kernels
(torch's profiler, CUPTI: CuPy's kernels too), the trainer's own threads waiting on one another (the leader
worker, the link's event loop and the training loop share one interpreter), and which of them holds the
host. A GPU machine is lent for minutes at a time, so one run must bring all three back. This module takes
them around iterations ``[start, start + count)`` of the first trainer of the first site and writes one text
file: torch's key averages (by device time and by host time) and a sampling profile of every Python thread
(``sys._current_frames`` every millisecond: where each thread's innermost frames were).

Off unless the environment variable is set; nothing here runs in a user's job.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["ENV_VAR", "ITERS_VAR", "IterationProfile"]

ENV_VAR = "WANRT_DEMO_PROFILE"
#: ``START:COUNT`` of the iterations profiled (default 6:8, inside ``tools/bench_gpu.py --quick``'s 17)
ITERS_VAR = "WANRT_DEMO_PROFILE_ITERS"


class _Sampler(threading.Thread):
    """Every ``period_s``: the innermost ``depth`` frames of every other thread, counted per thread."""

    def __init__(self, period_s: float = 0.001, depth: int = 3) -> None:
        super().__init__(name="wanrt-profile-sampler", daemon=True)
        self.period_s = period_s
        self.depth = depth
        self.samples: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self.ticks = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        me = threading.get_ident()
        while not self._stop_event.wait(self.period_s):
            names = {t.ident: t.name for t in threading.enumerate()}
            self.ticks += 1
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                parts = []
                f: Any = frame
                for _ in range(self.depth):
                    if f is None:
                        break
                    code = f.f_code
                    parts.append(f"{code.co_name} ({Path(code.co_filename).name}:{f.f_lineno})")
                    f = f.f_back
                self.samples[names.get(ident, str(ident))][" < ".join(parts)] += 1

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5.0)

    def report(self, top: int = 12) -> str:
        lines = [f"sampling profile: {self.ticks} ticks of {self.period_s * 1e3:.1f} ms"]
        for name, counter in sorted(self.samples.items()):
            total = sum(counter.values())
            lines.append(f"-- thread {name} ({total} samples)")
            for stack, n in counter.most_common(top):
                lines.append(f"  {100.0 * n / max(total, 1):5.1f}%  {stack}")
        return "\n".join(lines)


class IterationProfile:
    """Profiles iterations ``[start, start + count)`` when :data:`ENV_VAR` names a directory."""

    def __init__(self, label: str, *, enabled: bool) -> None:
        out = os.environ.get(ENV_VAR)
        self.path = Path(out) / f"profile-{label}.txt" if (out and enabled) else None
        first, _, count = os.environ.get(ITERS_VAR, "6:8").partition(":")
        self.start = int(first)
        self.stop_at = self.start + int(count or 8)
        self._torch: Any = None
        self._sampler: _Sampler | None = None
        self._t0 = 0.0

    def at(self, iteration: int) -> None:
        """Call once per iteration with the number of iterations done."""
        if self.path is None:
            return
        if iteration == self.start and self._torch is None:
            self._begin()
        elif iteration == self.stop_at and self._torch is not None:
            self._end(iteration - self.start)

    def _begin(self) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self._torch = profile(activities=acts)
        self._torch.__enter__()
        self._sampler = _Sampler()
        self._sampler.start()
        self._t0 = time.monotonic()

    def _end(self, iterations: int) -> None:
        import torch

        wall = time.monotonic() - self._t0
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self._torch.__exit__(None, None, None)
        assert self._sampler is not None
        self._sampler.stop()
        ka = self._torch.key_averages()
        parts = [f"{iterations} iterations in {wall:.3f} s ({1e3 * wall / max(iterations, 1):.1f} ms each)"]
        for sort in ("self_cuda_time_total", "self_cpu_time_total"):
            try:
                parts.append(f"== torch key averages by {sort} ==\n{ka.table(sort_by=sort, row_limit=30)}")
            except (KeyError, AttributeError, RuntimeError) as exc:  # no CUDA events: say so
                parts.append(f"== {sort}: unavailable ({exc}) ==")
        parts.append(self._sampler.report())
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("\n\n".join(parts) + "\n")
        self.path = None  # once per run
