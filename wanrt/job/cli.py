"""``wanrt job init --sites a,b [--dir DIR] [--job NAME] [--no-scheduler]``: write a local job and print
how to start it (gateways, scheduler, one torchrun per site)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from wanrt.errors import ConfigError
from wanrt.job.files import write_job

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["init"], help="init: write the job's files")
    parser.add_argument("--sites", required=True, help="comma-separated site names, e.g. a,b")
    parser.add_argument("--dir", default="wanrt-job", help="where to write the files (default wanrt-job)")
    parser.add_argument("--job", default="local-job", help="the job's name (default local-job)")
    parser.add_argument("--base-port", type=int, default=7700, help="first TCP port (gateways, scheduler)")
    parser.add_argument("--topology", default="tree", help="star | tree | ring | parent_child | allpairs")
    parser.add_argument("--no-scheduler", action="store_true", help="no scheduler: fixed settings")


def run(args: argparse.Namespace) -> int:
    sites = [s.strip() for s in args.sites.split(",") if s.strip()]
    try:
        files = write_job(
            Path(args.dir),
            job=args.job,
            sites=sites,
            base_port=args.base_port,
            with_scheduler=not args.no_scheduler,
            topology=args.topology,
        )
    except ConfigError as exc:
        print(f"wanrt job: {exc}", file=sys.stderr)
        return 2
    d = files.directory
    print(f"wrote job {args.job!r} for sites {', '.join(sites)} in {d}/ (secret and control token: mode 600)")
    print("start it (each line in its own terminal, or with &):")
    if files.scheduler is not None:
        print(f"  wanrt scheduler --config {files.scheduler}")
    for path in files.gateways.values():
        print(f"  wanrt gateway --config {path}")
    for i, (site, url) in enumerate(files.trainer_urls.items()):
        print(
            f"  torchrun --nproc-per-node 2 --master-port {29500 + i} train.py --site {site} "
            f"--gateway {url} --job {args.job} --secret-file {files.secret}"
        )
    return 0
