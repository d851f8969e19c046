"""The floors, checked: every import of the shipped packages runs downward or stays in its own room.

docs/architecture.md draws the house. From the bottom:

0. the ground floor, in ``wanrt``: errors, config loading, keys and secrets, payload, the protocol with
   every wire schema (trainer, peer and scheduler messages), codec, kernels;
1. ``transports``: byte movers, shaped links, TLS, the daemons' shared command-line pieces;
2. three rooms side by side that never import each other: ``gateways``, ``scheduler`` and the trainer
   client ``wanrt.client`` (what gateway and scheduler say to each other is a schema on the ground floor);
3. ``sims``: the simulator and the network-namespace harness, which drive whole gateway and scheduler
   nodes;
4. the top floor: the demo, ``wanrt job``, the command-line dispatch;
5. outside the house: ``tests`` and ``tools``, which no shipped module may import.

A module may import its own room and any floor below; anything else (upward, or sideways into a room of
the same floor) is a violation. The check parses every module's source (``ast``), so an import inside a
function or under ``TYPE_CHECKING`` counts as much as one at the top: each is a dependency a reader has
to follow, and a lazy upward import is still an upward import. A module no room claims fails too, so a new
package has to be placed on a floor before it can be imported at all.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: The packages that ship in the wheel (pyproject's ``packages.find``); they are what the check reads.
PACKAGES = ("wanrt", "gateways", "scheduler", "transports", "sims")

#: Rooms: (dotted prefix, floor, room). The longest matching prefix places a module. Rooms on one floor
#: may not import each other.
ROOMS: tuple[tuple[str, int, str], ...] = (
    # 0: the ground floor. ``wanrt`` itself (the package's __init__) is the public facade: errors and the
    # payload class eagerly, the client's names lazily (see PERMANENT below).
    ("wanrt", 0, "ground"),
    ("wanrt.errors", 0, "ground"),
    ("wanrt.config", 0, "ground"),
    ("wanrt.keys", 0, "ground"),
    ("wanrt.job_secret", 0, "ground"),
    ("wanrt.payload", 0, "ground"),
    ("wanrt.protocol", 0, "ground"),
    ("wanrt.live_settings", 0, "ground"),
    ("wanrt.rank_telemetry", 0, "ground"),
    ("wanrt.codec", 0, "ground"),
    ("wanrt.kernels", 0, "ground"),
    ("wanrt.kernel_env", 0, "ground"),
    # 1
    ("transports", 1, "transports"),
    # 2: side by side
    ("gateways", 2, "gateways"),
    ("scheduler", 2, "scheduler"),
    ("wanrt.client", 2, "client"),
    # 3
    ("sims", 3, "sims"),
    # 4: the top floor
    ("wanrt.demo", 4, "top"),
    ("wanrt.job", 4, "top"),
    ("wanrt.cli", 4, "top"),
    ("wanrt.__main__", 4, "top"),
    # 5: outside the shipped house
    ("tests", 5, "outside"),
    ("tools", 5, "outside"),
)

#: Imports that break the floors on purpose, for good: (importing module, imported module) -> why.
PERMANENT: Mapping[tuple[str, str], str] = {
    # ``wanrt.init`` / ``wanrt.Context`` are the public API; ``wanrt.__getattr__`` imports the client on
    # first use only, so ``from wanrt.errors import ...`` (which runs wanrt/__init__) never loads it.
    ("wanrt", "wanrt.client"): "the public facade resolves the client's names lazily",
}

#: Violations still present, each to be removed by the change named beside it. The lead empties this list
#: at merge; a stale entry (one that no longer occurs) fails the test, so the list can only shrink.
ALLOWED_FOR_NOW: Mapping[tuple[str, str], str] = {
    # The live-settings / config-update schema (gateways/wire/config_update.py, wanrt/live_settings.py) is
    # being rewritten as one typed schema on the ground floor by the helper "schema" (issue 22 item 2);
    # until then the scheduler builds the trainers' ConfigUpdate with the gateways' function.
    ("scheduler.node", "gateways.wire.config_update"): "issue 22 item 2 (helper schema)",
}


@dataclass(frozen=True)
class Import:
    """One import statement's target, as written in ``module`` at ``line``."""

    module: str
    target: str
    line: int


def module_name(root: Path, path: Path) -> str:
    """``gateways/node/node.py`` -> ``gateways.node.node``; a package's __init__ is the package."""
    return path.relative_to(root).with_suffix("").as_posix().replace("/", ".").removesuffix(".__init__")


def find_modules(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            out[module_name(root, path)] = path
    return out


def imports_of(name: str, path: Path, known: Mapping[str, Path]) -> list[Import]:
    """Every import in ``path`` (module ``name``), wherever it is written, as absolute dotted targets.

    ``from a.b import c`` targets ``a.b.c`` when that is a module (``from wanrt import codec``), else
    ``a.b``; relative imports are resolved against the module's package.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out: list[Import] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend(Import(name, alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                out.append(Import(name, sub if sub in known else source, node.lineno))
    return out


def room_of(module: str, rooms: Iterable[tuple[str, int, str]] = ROOMS) -> tuple[int, str] | None:
    """(floor, room) of the longest room prefix that contains ``module``; None if no room claims it."""
    best: tuple[str, int, str] | None = None
    for prefix, floor, room in rooms:
        if (module == prefix or module.startswith(prefix + ".")) and (
            best is None or len(prefix) > len(best[0])
        ):
            best = (prefix, floor, room)
    return None if best is None else (best[1], best[2])


def violations(
    root: Path,
    packages: Iterable[str] = PACKAGES,
    rooms: Iterable[tuple[str, int, str]] = ROOMS,
    allowed: Iterable[tuple[str, str]] = (),
) -> list[str]:
    """One line per import that breaks the floors (and per module no room claims), naming both sides."""
    rooms = tuple(rooms)
    allowed = set(allowed)
    known = find_modules(root, packages)
    roots = {r[0].split(".")[0] for r in rooms}
    out: list[str] = []
    for name, path in known.items():
        here = room_of(name, rooms)
        if here is None:
            out.append(f"{name} ({path.relative_to(root)}) is on no floor: add its room to ROOMS")
            continue
        for imp in imports_of(name, path, known):
            if imp.target.split(".")[0] not in roots:
                continue  # the standard library or a third-party package
            there = room_of(imp.target, rooms)
            if there is None:
                out.append(f"{name}:{imp.line} imports {imp.target}, which is on no floor")
                continue
            if there == here or there[0] < here[0] or (name, imp.target) in allowed:
                continue
            way = "upward" if there[0] > here[0] else "sideways"
            out.append(
                f"{name}:{imp.line} (floor {here[0]}, {here[1]}) imports {imp.target} "
                f"(floor {there[0]}, {there[1]}): {way}"
            )
    return list(dict.fromkeys(out))  # one line per import statement and target


def _allowed_pairs() -> set[tuple[str, str]]:
    return set(PERMANENT) | set(ALLOWED_FOR_NOW)


def test_every_import_runs_downward() -> None:
    bad = violations(ROOT, allowed=_allowed_pairs())
    assert not bad, "imports that break the floors (docs/architecture.md):\n" + "\n".join(bad)


def test_the_check_reads_the_whole_house() -> None:
    known = find_modules(ROOT, PACKAGES)
    assert len(known) > 250
    assert {"wanrt.protocol.messages", "gateways.node.node", "scheduler.node", "wanrt.demo.cli"} <= set(known)


def test_the_allowlist_holds_only_live_violations() -> None:
    """An entry that no longer occurs must go, so the temporary list can only shrink."""
    found = {
        (line.split(":")[0], line.split(" imports ")[1].split(" ")[0])
        for line in violations(ROOT)
        if " imports " in line
    }
    stale = sorted((set(PERMANENT) | set(ALLOWED_FOR_NOW)) - found)
    assert not stale, f"allowlist entries that no longer occur (remove them): {stale}"


def test_the_ground_floor_loads_nothing_above_it_at_run_time() -> None:
    """The source check cannot see ``importlib`` or a package's ``__init__`` run as a side effect; so import
    every ground-floor module in a fresh interpreter and look at what got loaded."""
    ground = sorted(m for m in find_modules(ROOT, PACKAGES) if (room_of(m) or (-1, ""))[0] == 0)
    code = (
        "import importlib, json, sys\n"
        f"for m in {ground!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    roots = {prefix.split(".")[0] for prefix, _, _ in ROOMS}
    above = sorted(m for m in json.loads(out) if m.split(".")[0] in roots and (room_of(m) or (0, ""))[0] > 0)
    assert not above, f"importing the ground floor loaded modules from above it: {above}"


def _write(root: Path, files: Mapping[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


#: A small house: ground ``low``, rooms ``left``/``right`` on floor 1, ``top`` on floor 2.
_TOY_ROOMS = (("low", 0, "low"), ("left", 1, "left"), ("right", 1, "right"), ("top", 2, "top"))
_TOY = {
    "low/__init__.py": "",
    "low/base.py": "import os\n",
    "left/__init__.py": "",
    "left/a.py": "from low import base\nfrom low.base import os\n",
    "left/b.py": "from . import a\nfrom .a import base\n",
    "right/__init__.py": "",
    "right/c.py": "import low.base\n",
    "top/__init__.py": "",
    "top/main.py": "import left.a\nfrom right import c\n",
}


def test_a_clean_toy_house_passes(tmp_path: Path) -> None:
    _write(tmp_path, _TOY)
    assert violations(tmp_path, ("low", "left", "right", "top"), _TOY_ROOMS) == []


@pytest.mark.parametrize(
    ("rel", "source", "expected"),
    [
        # upward, at module level
        (
            "low/base.py",
            "import left.a\n",
            "low.base:2 (floor 0, low) imports left.a (floor 1, left): upward",
        ),
        # upward, hidden inside a function
        (
            "left/a.py",
            "def f():\n    from top.main import x\n",
            "left.a:4 (floor 1, left) imports top.main (floor 2, top): upward",
        ),
        # sideways, through ``from package import module``
        (
            "right/c.py",
            "from left import a\n",
            "right.c:2 (floor 1, right) imports left.a (floor 1, left): sideways",
        ),
        # upward, relative
        (
            "left/b.py",
            "from ..top import main\n",
            "left.b:3 (floor 1, left) imports top.main (floor 2, top): upward",
        ),
        # upward, under TYPE_CHECKING
        (
            "low/base.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from right.c import y\n",
            "low.base:4 (floor 0, low) imports right.c (floor 1, right): upward",
        ),
    ],
)
def test_an_added_bad_import_fails(tmp_path: Path, rel: str, source: str, expected: str) -> None:
    _write(tmp_path, {**_TOY, rel: _TOY[rel] + source})
    assert violations(tmp_path, ("low", "left", "right", "top"), _TOY_ROOMS) == [expected]


def test_an_allowlisted_import_passes_and_a_homeless_module_fails(tmp_path: Path) -> None:
    _write(tmp_path, {**_TOY, "right/c.py": "from left import a\n", "attic/__init__.py": ""})
    packages = ("low", "left", "right", "top", "attic")
    assert violations(tmp_path, packages, _TOY_ROOMS, allowed={("right.c", "left.a")}) == [
        "attic (attic/__init__.py) is on no floor: add its room to ROOMS"
    ]


def test_the_real_house_fails_when_an_upward_import_is_added(tmp_path: Path) -> None:
    """The same check on a copy of the real tree with one ground-floor module reaching into a gateway."""
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            dst = tmp_path / path.relative_to(ROOT)
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_text(path.read_text())
    errors = tmp_path / "wanrt" / "errors.py"
    errors.write_text(errors.read_text() + "\n\ndef _f() -> None:\n    import gateways.node.node\n")
    bad = violations(tmp_path, allowed=_allowed_pairs())
    assert len(bad) == 1
    assert (
        bad[0].startswith("wanrt.errors:")
        and "imports gateways.node.node (floor 2, gateways): upward" in bad[0]
    )
