"""The policies are sans-IO: no clocks, sockets, event loops or threads in scheduler/stragglers and
scheduler/barrier (time is always passed in)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
FORBIDDEN = {"asyncio", "socket", "time", "threading", "selectors", "uvloop", "datetime"}
FILES = sorted((ROOT / "scheduler" / "stragglers").glob("*.py")) + sorted(
    (ROOT / "scheduler" / "barrier").glob("*.py")
)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_no_io_imports(path: Path) -> None:
    tree = ast.parse(path.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & FORBIDDEN


def test_the_file_list_is_not_empty() -> None:
    assert len(FILES) >= 10
