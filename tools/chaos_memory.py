"""What grew in the chaos soak: tracemalloc snapshots and gc object counts, diffed between two points.

Why: the soak's ``rss_growth_mb`` is one number for six daemons, six test trainers and the soak's own
records, all in one process. To tell a runtime leak from the harness's bookkeeping (or from allocator
high-water), ``--trace-memory`` snapshots the Python heap where ``rss_growth_mb`` starts and where it
ends, and reports the growth per component (the package a file belongs to), per source line, and per
object type. tracemalloc slows the run (≈ 1.5–2×) and costs memory itself, so the run's RSS key is not
comparable with a run without it: use it to find, not to measure.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
import tempfile
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

__all__ = ["MemoryTrace", "component_of"]

ROOT = str(Path(__file__).resolve().parent.parent)

#: components, by the path prefix (relative to the repository) of the file that allocated
COMPONENTS = (
    "gateways/service",
    "gateways/rounds",
    "gateways/membership",
    "gateways/node",
    "gateways/sending",
    "gateways",
    "wanrt/client",
    "wanrt/protocol",
    "wanrt",
    "transports",
    "sims",
    "tools",
)


def component_of(filename: str) -> str:
    """The repository component of a source file, or the stdlib/site-packages module's top name."""
    if filename.startswith(ROOT + "/"):
        rel = filename[len(ROOT) + 1 :]
        for c in COMPONENTS:
            if rel.startswith(c + "/"):
                return c
        return rel
    parts = Path(filename).parts
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            return parts[parts.index(marker) + 1]
    return "python:" + Path(filename).stem if filename.endswith(".py") else filename


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            *("arena", "ordblks", "smblks", "hblks", "hblkhd"),
            *("usmblks", "fsmblks", "uordblks", "fordblks", "keepcost"),
        )
    ]


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallinfo2") and hasattr(libc, "malloc_trim") else None


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def pymalloc_mb() -> dict[str, float]:
    """pymalloc's arenas (its RSS) and the bytes its live objects use, from ``sys._debugmallocstats``
    (written by C to fd 2, so read through a temporary file)."""
    with tempfile.TemporaryFile("w+") as tmp:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(tmp.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read()
    out = {}
    for line in text.splitlines():
        name, eq, value = line.partition("=")
        if not eq:
            continue
        name = name.strip()
        if name == "# arenas allocated current":
            out["pymalloc_arenas"] = float(value.replace(",", ""))
        elif name == "# bytes in allocated blocks":
            out["pymalloc_in_use"] = round(float(value.replace(",", "")) / 2**20, 2)
        elif name == "Total" and "pymalloc_total" not in out:
            out["pymalloc_total"] = round(float(value.replace(",", "")) / 2**20, 2)
    return out


def allocator_mb() -> dict[str, float]:
    """Where the process's memory sits: RSS, glibc malloc's heap (in use, free but kept, mmapped chunks),
    pymalloc's live blocks (count), and the traced Python heap when tracemalloc runs. Free-but-kept
    glibc memory is RSS that no object holds (fragmentation, or a past peak not given back)."""
    out = {"rss": round(rss_mb(), 2), **pymalloc_mb()}
    libc = _libc()
    if libc is not None:
        libc.mallinfo2.restype = _MallInfo2
        mi = libc.mallinfo2()
        out.update(
            malloc_in_use=round(mi.uordblks / 2**20, 2),
            malloc_free_kept=round(mi.fordblks / 2**20, 2),
            malloc_mmapped=round(mi.hblkhd / 2**20, 2),
        )
    if tracemalloc.is_tracing():
        out["traced"] = round(tracemalloc.get_traced_memory()[0] / 2**20, 2)
    return out


def rss_after_trim_mb() -> float:
    """RSS once glibc gave back the free memory it keeps (``malloc_trim(0)``): a diagnostic of how much of
    the growth is the allocator's, not the objects'. Changes the process: call it only after the readings."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
    return round(rss_mb(), 2)


def _type_counts() -> Counter[str]:
    return Counter(type(o).__qualname__ for o in gc.get_objects())


class MemoryTrace:
    """Two points of one run: :meth:`mark` at the start, :meth:`report` at the end; :meth:`point` after
    every event (allocator readings), :meth:`middle` halfway (what still grows once bounded structures
    are full)."""

    def __init__(self, *, python_heap: bool = True) -> None:
        #: tracemalloc on (per line, per component): slower; off, allocator readings and gc counts only
        self.python_heap = python_heap
        if python_heap and not tracemalloc.is_tracing():
            tracemalloc.start(1)
        self._snap: tracemalloc.Snapshot | None = None
        self._types: Counter[str] = Counter()
        self._mid: tuple[tracemalloc.Snapshot | None, Counter[str]] | None = None
        self.points: list[dict[str, float]] = []

    def _take(self) -> tuple[tracemalloc.Snapshot | None, Counter[str]]:
        gc.collect()
        return (tracemalloc.take_snapshot() if self.python_heap else None), _type_counts()

    def mark(self) -> None:
        self._snap, self._types = self._take()
        self.point(0)

    def point(self, label: float) -> None:
        """Allocator readings (MB) at ``label`` (an iteration)."""
        gc.collect()
        self.points.append({"iteration": label, **allocator_mb()})

    def middle(self) -> None:
        self._mid = self._take()

    def report(self, top: int = 25) -> dict[str, Any]:
        """Growth since :meth:`mark` (and since :meth:`middle`): per component and per line (MB, with
        tracemalloc), per object type (count), and the allocator readings per event."""
        snap, types = self._take()
        out = self._diff(self._snap, self._types, snap, types, top)
        out["points"] = self.points
        if self._mid is not None:
            out["second_half"] = self._diff(*self._mid, snap, types, top)
        return out

    @staticmethod
    def _diff(
        old: tracemalloc.Snapshot | None,
        old_types: Counter[str],
        snap: tracemalloc.Snapshot | None,
        types: Counter[str],
        top: int,
    ) -> dict[str, Any]:
        grown_types = Counter({k: types[k] - old_types.get(k, 0) for k in types})
        out: dict[str, Any] = {"object_types_grown": dict(grown_types.most_common(top))}
        if old is None or snap is None:
            return out
        lines = snap.compare_to(old, "lineno")
        per_component: Counter[str] = Counter()
        for d in lines:
            per_component[component_of(d.traceback[0].filename)] += d.size_diff
        out["traced_growth_mb"] = round(sum(d.size_diff for d in lines) / 2**20, 2)
        out["per_component_mb"] = {k: round(v / 2**20, 3) for k, v in per_component.most_common() if v}
        out["top_lines"] = [
            {
                "where": f"{_short(d.traceback[0].filename)}:{d.traceback[0].lineno}",
                "mb": round(d.size_diff / 2**20, 3),
                "count": d.count_diff,
            }
            for d in lines[:top]
        ]
        return out


def _short(filename: str) -> str:
    return filename[len(ROOT) + 1 :] if filename.startswith(ROOT + "/") else component_of(filename)


def print_report(rep: dict[str, Any], title: str = "from the first RSS reading") -> None:
    if rep.get("points"):
        keys = list(rep["points"][0])
        print("\nper event (MB; pymalloc_arenas: count):")
        print("  " + " ".join(f"{k:>17}" for k in keys))
        for p in rep["points"]:
            print("  " + " ".join(f"{p.get(k, float('nan')):>17g}" for k in keys))
    if "traced_growth_mb" in rep:
        print(f"\ntraced Python heap growth {title}: {rep['traced_growth_mb']} MB")
        print("  per component (MB):")
        for k, v in rep["per_component_mb"].items():
            if abs(v) >= 0.01:
                print(f"    {k:<40} {v:>9.3f}")
        print("  top lines (MB, objects):")
        for row in rep["top_lines"]:
            print(f"    {row['where']:<60} {row['mb']:>9.3f} {row['count']:>9}")
    print(f"  object types grown {title} (count):")
    for k, v in rep["object_types_grown"].items():
        if v:
            print(f"    {k:<40} {v:>9}")
    if "second_half" in rep:
        print_report(rep["second_half"], "in the second half of the events")
