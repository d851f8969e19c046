"""The sans-IO rule, checked: only service modules may import asyncio, sockets, threads or clocks.

Two checks, because each misses what the other sees. The source check reads every module of the sans-IO
packages and fails on an import of a forbidden module, wherever it is written (also inside a function).
The run-time check imports those packages in a fresh interpreter and fails if asyncio, socket, ssl,
uvloop or aiohttp got loaded anyway (through a dependency). threading, socket and selectors are left out
of this one: numpy loads threading, and scipy (numpy.testing → concurrent.futures) loads socket.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Module names a sans-IO module may not import (time: a clock; the node and policies get ``now``).
FORBIDDEN = frozenset(
    {"asyncio", "socket", "ssl", "selectors", "threading", "time", "uvloop", "aiohttp", "subprocess"}
)

#: Packages and modules whose code must stay sans-IO. Service code lives in the excluded folders.
SANS_IO = (
    "gateways/node",
    "gateways/rounds",
    "gateways/sending",
    "gateways/membership",
    "gateways/config.py",
    "gateways/stats.py",
    "wanrt/protocol",
    "wanrt/codec",
    "wanrt/kernels",
    "scheduler",
    "sims",
    # test fixtures that model the client's exact sums and resync: sans-IO like the client logic they mirror
    "tools/harness/exact_params.py",
    "tools/harness/exact_payloads.py",
)

#: Inside those, the I/O adapters and command-line front ends (they drive the sans-IO objects).
EXCLUDED = (
    "sims/netns",
    "sims/cli.py",
    "scheduler/service",
    "wanrt/protocol/fuzz.py",
    # the kernel-path choosers build each path once under a lock, and the codec compiles its fused kernels
    # in a background thread so that a gateway's event loop never stalls on numba (docs/kernels.md)
    "wanrt/kernels/backend.py",
    "wanrt/codec/kernel_choice.py",
    "wanrt/kernels/cupy_kernels.py",  # a lock around the per-device kernel cache
    "wanrt/kernels/cupy_staging.py",  # a lock around the upload slots (leader and trainer threads)
    "wanrt/kernels/warmup.py",  # times the start-up compile so that the trainer can log it
)


def _modules() -> list[Path]:
    out: list[Path] = []
    for entry in SANS_IO:
        path = ROOT / entry
        files = [path] if path.suffix == ".py" else sorted(path.rglob("*.py"))
        for f in files:
            rel = f.relative_to(ROOT).as_posix()
            if not any(rel == e or rel.startswith(e + "/") for e in EXCLUDED):
                out.append(f)
    return out


def _imports(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_the_guard_sees_modules() -> None:
    mods = _modules()
    assert len(mods) > 30
    assert ROOT / "gateways/node/node.py" in mods


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_io_imports_in_source(path: Path) -> None:
    bad = _imports(ast.parse(path.read_text(), filename=str(path))) & FORBIDDEN
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}: move that code to a service module"


def test_the_source_check_catches_an_import() -> None:
    assert _imports(ast.parse("def f():\n    import asyncio\nfrom time import monotonic\n")) >= {
        "asyncio",
        "time",
    }


def test_no_io_modules_loaded_at_run_time() -> None:
    pkgs = sorted(
        {
            f.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".").removesuffix(".__init__")
            for f in _modules()
        }
    )
    code = (
        "import importlib, sys\n"
        f"for m in {pkgs!r}: importlib.import_module(m)\n"
        "print(sorted(m for m in ('asyncio', 'ssl', 'uvloop', 'aiohttp')"
        " if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    assert out.strip() == "[]"
