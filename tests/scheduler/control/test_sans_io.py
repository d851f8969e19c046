"""The decision objects are sans-IO: no event loop, sockets, clocks or threads anywhere in their modules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
FORBIDDEN = {"asyncio", "socket", "time", "threading", "selectors", "uvloop", "subprocess"}
MODULES = sorted((ROOT / "scheduler" / "control").glob("*.py")) + [
    ROOT / "scheduler" / "profile" / name
    for name in ("acquisition.py", "bayesopt.py", "config.py", "surrogate.py", "probe.py")
]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_module_imports_no_io(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            continue
        for name in names:
            assert name.split(".")[0] not in FORBIDDEN, f"{path.name} imports {name}"
