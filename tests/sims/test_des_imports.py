"""The simulator is sans-IO: no asyncio, sockets, threads or clocks in sims/ (the netns harness and the
CLI module, which measures wall time, are the I/O layer)."""

from __future__ import annotations

import ast
from pathlib import Path

import sims

FORBIDDEN = {"asyncio", "socket", "time", "threading", "selectors", "uvloop"}
EXEMPT = {"netns"}
EXEMPT_FILES = {"cli.py"}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


def test_sims_imports_no_io() -> None:
    root = Path(sims.__file__).parent
    checked = 0
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in EXEMPT or (len(rel.parts) == 1 and rel.name in EXEMPT_FILES):
            continue
        bad = imported_modules(path) & FORBIDDEN
        assert not bad, f"{rel} imports {sorted(bad)}"
        checked += 1
    assert checked >= 10
