"""``wanrt scheduler --config job.toml [--ready-file PATH] [--decisions-file PATH] [--log-level L]``: the
job's scheduler daemon.

Exit codes as ``wanrt gateway``: 0 after a clean stop (SIGTERM/SIGINT), 2 for a bad configuration (the
message names the key), 1 when it cannot start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from pathlib import Path

from scheduler.daemon_config import SchedulerDaemonConfig, load_scheduler_config
from scheduler.service.daemon import SchedulerDaemon
from scheduler.service.policies import make_policy
from transports import install_uvloop
from transports.daemon_cli import add_log_level, setup_logging, write_json_atomically
from wanrt.errors import ConfigError, WanrtError

__all__ = ["add_arguments", "run"]

log = logging.getLogger("wanrt.scheduler")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, metavar="TOML", help="the job's scheduler config file")
    parser.add_argument(
        "--ready-file", metavar="PATH", help="write JSON {pid, job, listen, metrics_url} here once listening"
    )
    parser.add_argument(
        "--decisions-file",
        metavar="PATH",
        help="append a JSON line per committed decision and per decide tick (values, bandwidth estimate)",
    )
    add_log_level(parser)


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    try:
        cfg = load_scheduler_config(args.config)
    except ConfigError as exc:
        print(f"wanrt scheduler: configuration error: {exc}", file=sys.stderr)
        return 2
    install_uvloop()
    try:
        decisions = getattr(args, "decisions_file", None)
        asyncio.run(_serve(cfg, args.ready_file, None if decisions is None else Path(decisions)))
    except WanrtError as exc:
        print(f"wanrt scheduler: cannot run: {exc}", file=sys.stderr)
        return 1
    return 0


async def _serve(
    cfg: SchedulerDaemonConfig, ready_file: str | None, decisions_file: Path | None = None
) -> None:
    daemon = SchedulerDaemon(cfg, policy=make_policy(cfg), decisions_file=decisions_file)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, daemon.request_stop)

    def ready() -> None:
        info = daemon.ready_info()
        if ready_file:
            write_json_atomically(Path(ready_file), info)
        log.info("ready: %s", json.dumps(info))

    try:
        await daemon.run(on_ready=ready)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    log.info("stopped")
