"""No class in the daemons or the trainer client grows past ``MAX_CLASS_LINES`` (issue 22's done-when).

Why a test: the node, the round engine and the client's Context were each split from 950–1 080 lines to
under 600 so that a reader can hold one in mind; each of them is also where every new feature wants to
add "just one more method". A feature that needs more room goes into a collaborator with a name that says
what it holds (as the outer loop, the prediction and the resync state did), not into the class.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the packages whose classes are held to the bound (the sans-IO cores and the client)
PACKAGES = ("gateways", "scheduler", "wanrt/client")
MAX_CLASS_LINES = 600


def class_sizes(root: Path) -> list[tuple[int, str]]:
    """(lines from ``class`` to its last line, "path:Name") of every class in ``PACKAGES``."""
    sizes = []
    for pkg in (p for p in PACKAGES if (root / p).is_dir()):
        for path in sorted((root / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                    sizes.append((node.end_lineno - node.lineno + 1, f"{path.relative_to(root)}:{node.name}"))
    return sizes


def test_every_package_is_found() -> None:
    assert all((ROOT / pkg).is_dir() for pkg in PACKAGES)
    assert len(class_sizes(ROOT)) > 50  # the walk found the classes, so the bound below checks something


@pytest.mark.parametrize("pkg", PACKAGES)
def test_no_class_is_over_the_bound(pkg: str) -> None:
    over = [(n, where) for n, where in class_sizes(ROOT) if where.startswith(pkg) and n > MAX_CLASS_LINES]
    assert not over, (
        f"classes over {MAX_CLASS_LINES} lines: {sorted(over, reverse=True)}; move the new part into a "
        "collaborator module with a name that says what it holds"
    )


def test_the_bound_catches_a_long_class(tmp_path: Path) -> None:
    pkg = tmp_path / "gateways"
    pkg.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_CLASS_LINES))
    (pkg / "big.py").write_text(f"class Big:\n{body}\n")
    assert class_sizes(tmp_path) == [(MAX_CLASS_LINES + 1, "gateways/big.py:Big")]
