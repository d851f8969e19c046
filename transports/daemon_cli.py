"""What every daemon command shares: the ``--log-level`` flag, the log line format, and the ready / stats
files written so that a reader sees either nothing or the whole file.

``wanrt gateway`` and ``wanrt scheduler`` are two rooms of the same floor and must not import each other
(docs/architecture.md), so the pieces both entry points use live here, one floor below them, beside
:func:`~transports.loop.install_uvloop`. Nothing here runs on import.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["add_log_level", "setup_logging", "write_json_atomically"]


def add_log_level(parser: argparse.ArgumentParser) -> None:
    """``--log-level``, as every daemon command has it."""
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        type=str.upper,
        help="log verbosity (default INFO)",
    )


def setup_logging(level: str) -> None:
    """Daemon logs: one line per event on stderr, with time, level and the module that says it."""
    logging.basicConfig(
        level=getattr(logging, level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def write_json_atomically(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` so that a reader sees either nothing or the whole file (temp file + rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2, sort_keys=True, default=str)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
