"""The summary table of ``tools/gpu_check.sh``: the ``cuda``-marked tests (from pytest's JUnit XML) and the
keys of ``tools/bench_gpu.py --json`` against the issue's targets, in one table a GPU session can paste.

``python tools/gpu_summary.py DIR`` reads ``DIR/cuda-tests.xml`` and ``DIR/bench_gpu.json``; exit status 0
when every collected test passed (or was skipped for a stated reason) and the benchmark wrote its JSON,
1 otherwise. Targets missed are reported, not turned into a failure: they are measurements.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["TestCounts", "main", "read_bench", "read_junit", "render"]


@dataclass
class TestCounts:
    tests: int = 0
    failures: int = 0
    errors: int = 0
    skipped: int = 0
    failed: list[str] = field(default_factory=list)
    skip_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def passed(self) -> int:
        return self.tests - self.failures - self.errors - self.skipped

    @property
    def ok(self) -> bool:
        return self.tests > 0 and self.failures == 0 and self.errors == 0


def read_junit(path: Path) -> TestCounts | None:
    """Counts from pytest's ``--junitxml`` file (None when it is missing or unreadable)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    c = TestCounts()
    for case in root.iter("testcase"):
        c.tests += 1
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        if case.find("failure") is not None:
            c.failures += 1
            c.failed.append(name)
        elif case.find("error") is not None:
            c.errors += 1
            c.failed.append(name)
        elif (skip := case.find("skipped")) is not None:
            c.skipped += 1
            reason = (skip.get("message") or "").strip()
            c.skip_reasons[reason] = c.skip_reasons.get(reason, 0) + 1
    return c


def read_bench(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data


def _fmt(v: Any) -> str:
    if not isinstance(v, (int, float)):
        return str(v)
    return "nan" if v != v else f"{v:.4g}"


def render(tests: TestCounts | None, bench: dict[str, Any] | None) -> str:
    lines = ["== cuda-marked tests =="]
    if tests is None:
        lines.append("no JUnit XML: the test run did not finish (see cuda-tests.log)")
    else:
        lines.append(
            f"{tests.tests} collected: {tests.passed} passed, {tests.failures} failed, "
            f"{tests.errors} errors, {tests.skipped} skipped"
        )
        lines.extend(f"  FAILED {name}" for name in tests.failed)
        lines.extend(f"  skipped ×{n}: {reason}" for reason, n in tests.skip_reasons.items())
    lines.append("== tools/bench_gpu.py --quick ==")
    if bench is None:
        lines.append("no bench_gpu.json: the benchmark did not finish (see bench_gpu.log)")
    elif bench.get("skipped"):
        lines.append(f"skipped: {bench['skipped']}")
    else:
        lines.append(f"{bench.get('device_name', '?')}, torch {bench.get('torch', '?')}")
        targets: dict[str, str] = bench.get("targets", {})
        met: dict[str, bool | None] = bench.get("met", {})
        rows = [("key", "value", "target", "met")]
        for key, value in bench.get("keys", {}).items():
            m = met.get(key)
            rows.append((key, _fmt(value), targets.get(key, ""), "" if m is None else ("yes" if m else "NO")))
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines.extend("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)
        lines.extend(f"note: {n}" for n in bench.get("notes", []))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: gpu_summary.py DIR (holding cuda-tests.xml and bench_gpu.json)", file=sys.stderr)
        return 2
    out = Path(args[0])
    tests = read_junit(out / "cuda-tests.xml")
    bench = read_bench(out / "bench_gpu.json")
    print(render(tests, bench))
    return 0 if tests is not None and tests.ok and bench is not None else 1


if __name__ == "__main__":
    sys.exit(main())
