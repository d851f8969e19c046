"""``wanrt gateway --config site.toml [--ready-file PATH] [--stats-file PATH] [--log-level L]``.

The daemon entry point, and so the only place that installs uvloop and signal handlers. Exit codes: 0 after
a clean (phased) shutdown, 2 for a bad configuration (the message names the key), 1 when the daemon cannot
start (e.g. an address already in use). ``--ready-file`` is written atomically (tmp + rename) once every
listener is up, with the actual bound addresses; ``--stats-file`` at shutdown (gateways.stats).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import signal
import sys
from pathlib import Path

from gateways.config import load_gateway_config
from gateways.service.daemon import GatewayDaemon
from transports import install_uvloop
from transports.daemon_cli import add_log_level, setup_logging, write_json_atomically
from wanrt.errors import ConfigError, WanrtError

__all__ = ["add_arguments", "run"]

log = logging.getLogger("wanrt.gateway")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, metavar="TOML", help="the site's gateway config file")
    parser.add_argument(
        "--ready-file",
        metavar="PATH",
        help="write JSON {pid, site, listen, trainer_listen, metrics_url} here once listening",
    )
    parser.add_argument(
        "--stats-file", metavar="PATH", help="write the final counters here (JSON) at shutdown"
    )
    parser.add_argument(
        "--resume-at",
        type=int,
        metavar="N",
        help="resume a stopped job at iteration N, its trainers' checkpoint (the same N at every gateway)",
    )
    add_log_level(parser)


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    try:
        cfg = load_gateway_config(args.config)
        if getattr(args, "resume_at", None) is not None:
            cfg = dataclasses.replace(cfg, resume_at=args.resume_at)
    except ConfigError as exc:
        print(f"wanrt gateway: configuration error: {exc}", file=sys.stderr)
        return 2
    install_uvloop()
    try:
        return asyncio.run(_serve(GatewayDaemon(cfg), args.ready_file, args.stats_file))
    except ConfigError as exc:  # e.g. an unreadable trace file found while building the daemon
        print(f"wanrt gateway: configuration error: {exc}", file=sys.stderr)
        return 2
    except WanrtError as exc:
        print(f"wanrt gateway: cannot run: {exc}", file=sys.stderr)
        return 1


async def _serve(daemon: GatewayDaemon, ready_file: str | None, stats_file: str | None) -> int:
    loop = asyncio.get_running_loop()

    def stop(sig: signal.Signals) -> None:
        log.info("%s received: stop requested", sig.name)
        daemon.request_stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop, sig)

    def ready() -> None:
        info = daemon.ready_info()
        if ready_file:
            write_json_atomically(Path(ready_file), info)
        log.info("ready: %s", json.dumps(info))

    try:
        stats = await daemon.run(on_ready=ready)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    if stats_file:
        write_json_atomically(Path(stats_file), stats)
    log.info("stopped")
    return 0
