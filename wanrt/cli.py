"""The ``wanrt`` command line: one entry point, one subcommand per daemon or job.

Subcommands are registered here but only the chosen one's module is imported, so ``wanrt --help`` is fast,
importing :mod:`wanrt.cli` has no side effects (uvloop is installed by the daemon commands only), and a
``wanrt gateway`` process never loads what ``wanrt profile`` needs (scikit-learn, torch: ~70 MB of RSS).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from wanrt.errors import WanrtError

# name -> (module that defines add_arguments(parser) and run(args) -> int, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("wanrt.demo.cli", "train a real model across emulated WAN sites, dense baseline beside it"),
    "gateway": ("gateways.service.cli", "run the per-site gateway daemon (wanrt gateway --config site.toml)"),
    "job": ("wanrt.job.cli", "write a local job: secret, gateway configs, scheduler (wanrt job init)"),
    "scheduler": ("scheduler.service.cli", "run the job's scheduler (wanrt scheduler --config job.toml)"),
    "profile": (
        "wanrt.demo.profile_cli",
        "profile the convergence penalty ḡ(r, Σx) for the scheduler (JSON)",
    ),
    "sim": ("sims.cli", "simulate gateways on virtual time from a scenario (wanrt sim SCENARIO.toml)"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; the arguments of ``command`` only (the others show their one-line help)."""
    parser = argparse.ArgumentParser(
        prog="wanrt",
        description="Data-parallel PyTorch training across GPU clusters joined by a WAN.",
    )
    parser.add_argument("--version", action="version", version="wanrt 0.1.0")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            mod = importlib.import_module(module)
            mod.add_arguments(p)
            p.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in args_list if not a.startswith("-")), None)
    parser = build_parser(command if command in SUBCOMMANDS else None)
    args = parser.parse_args(args_list)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args))
    except WanrtError as exc:
        print(f"wanrt {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
