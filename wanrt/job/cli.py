"""``wanrt job init --sites a,b [--dir DIR] [--job NAME] [--no-scheduler]``: write a local job and print
how to start it (gateways, scheduler, one torchrun per site)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from wanrt.errors import ConfigError
from wanrt.job.files import write_job, write_keys

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["init"], help="init: write the job's files")
    parser.add_argument("--sites", required=True, help="comma-separated site names, e.g. a,b")
    parser.add_argument("--dir", default="wanrt-job", help="where to write the files (default wanrt-job)")
    parser.add_argument("--job", default="local-job", help="the job's name (default local-job)")
    parser.add_argument("--base-port", type=int, default=7700, help="first TCP port (gateways, scheduler)")
    parser.add_argument("--topology", default="tree", help="star | tree | ring | parent_child | allpairs")
    parser.add_argument("--no-scheduler", action="store_true", help="no scheduler: fixed settings")
    parser.add_argument(
        "--shared-secret",
        action="store_true",
        help="one secret for every gateway and trainer (default: per-site keys, see docs/gateway.md)",
    )
    parser.add_argument(
        "--keys-only",
        action="store_true",
        help="rotate: write new per-site keys into an existing job directory (restart the daemons after)",
    )


def run(args: argparse.Namespace) -> int:
    sites = [s.strip() for s in args.sites.split(",") if s.strip()]
    if args.keys_only:
        d = Path(args.dir)
        if not d.is_dir():
            print(f"wanrt job: {d} is not a job directory", file=sys.stderr)
            return 2
        write_keys(d, job=args.job, sites=sites)
        print(f"wrote new keys for sites {', '.join(sites)} in {d}/keys/: restart gateways and scheduler")
        return 0
    try:
        files = write_job(
            Path(args.dir),
            job=args.job,
            sites=sites,
            base_port=args.base_port,
            with_scheduler=not args.no_scheduler,
            topology=args.topology,
            keys="shared" if args.shared_secret else "per-site",
        )
    except ConfigError as exc:
        print(f"wanrt job: {exc}", file=sys.stderr)
        return 2
    d = files.directory
    kind = "one job secret" if files.secret is not None else "per-site keys in keys/"
    print(f"wrote job {args.job!r} for sites {', '.join(sites)} in {d}/ ({kind}, control token: mode 600)")
    print("start it (each line in its own terminal, or with &):")
    if files.scheduler is not None:
        print(f"  wanrt scheduler --config {files.scheduler}")
    for path in files.gateways.values():
        print(f"  wanrt gateway --config {path}")
    for i, (site, url) in enumerate(files.trainer_urls.items()):
        print(
            f"  torchrun --nproc-per-node 2 --master-port {29500 + i} train.py --site {site} "
            f"--gateway {url} --job {args.job} --secret-file {files.trainer_secrets[site]}"
        )
    print("watch it:")
    for name, url in files.status_urls.items():
        print(f"  curl {url}    # {name}")
    return 0
