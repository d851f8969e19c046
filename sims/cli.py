"""``wanrt sim SCENARIO.toml``: run a scenario on the discrete-event simulator; table, JSON, plots.

A scenario name without a path (``wanrt sim tree-1000``) is looked up among the packaged examples in
``sims/scenarios``. Wall time is measured here (the simulator itself never reads a clock).
"""

from __future__ import annotations

import argparse
import json
import time
from importlib import resources
from pathlib import Path

from wanrt.errors import ConfigError

__all__ = ["add_arguments", "packaged_scenarios", "resolve_scenario", "run"]


def packaged_scenarios() -> dict[str, Path]:
    """The example scenarios shipped in the package, by name (file stem)."""
    root = resources.files("sims") / "scenarios"
    out = {}
    for entry in root.iterdir():
        if entry.name.endswith(".toml"):
            out[entry.name[: -len(".toml")]] = Path(str(entry))
    return dict(sorted(out.items()))


def resolve_scenario(name: str) -> Path:
    p = Path(name)
    if p.is_file():
        return p
    shipped = packaged_scenarios()
    if name in shipped:
        return shipped[name]
    raise ConfigError(
        f"no scenario file {name!r} (packaged examples: {', '.join(shipped) or 'none'})", key="scenario"
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", help="scenario TOML file, or the name of a packaged example")
    p.add_argument("--json", metavar="PATH", help="write the full result (series included) as JSON")
    p.add_argument("--plots", metavar="DIR", help="write PNG plots (round times, links, frontier)")
    p.add_argument("--seed", type=int, help="override [sim] seed")
    p.add_argument("--iterations", type=int, help="override [sim] iterations")
    p.add_argument("--list", action="store_true", help="list the packaged example scenarios and exit")


def run(args: argparse.Namespace) -> int:
    from sims.des.scenario import load_scenario
    from sims.des.world import run_scenario

    if args.list:
        for name, path in packaged_scenarios().items():
            print(f"{name:<24} {path}")
        return 0
    sc = load_scenario(resolve_scenario(args.scenario))
    changes: dict[str, object] = {}
    if args.seed is not None:
        changes["seed"] = args.seed
    if args.iterations is not None:
        changes["iterations"] = args.iterations
    if changes:
        sc = sc.replace(**changes)
    result = run_scenario(sc, clock=time.perf_counter)
    print(result.table())
    if args.json:
        Path(args.json).write_text(json.dumps(result.to_json(), allow_nan=True))
        print(f"JSON: {args.json}")
    if args.plots:
        from sims.des.plots import write_plots

        for path in write_plots(result, args.plots):
            print(f"plot: {path}")
    return 0 if result.finished else 1
