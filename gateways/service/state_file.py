"""Where this gateway's job stood, on disk, so that gateways restarted together resume the job.

A restarted gateway is *fresh*: alone it would take the job's position from its first link, but two
fresh gateways would both say "no round yet" and start a new job at iteration 0 while their trainers are
at iteration N (reliability item 12). So each gateway keeps its frontier in ``state_file`` (written
whenever it advances, atomically: a temporary file renamed over the old one), and a fresh gateway
announces the frontier it read; the join rule then puts the job's restart past every iteration any site
had seen (``max(frontiers) + 1 + window``), and the trainers' re-sent pushes are carried into it, not lost.

The file survives a crash of the process (the page cache has it); after a crash of the machine it may be
a little stale, which the join margin (a window of iterations) absorbs when the frontier moved less than
that since the last write reached the disk. Delete it (or use another job name) to start the job anew.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from transports.daemon_cli import write_json_atomically

__all__ = ["load_frontier", "save_frontier"]

log = logging.getLogger(__name__)

#: the file holds three short fields: anything larger is not ours
_MAX_BYTES = 4096


def load_frontier(path: str, *, job: str, site: str) -> int:
    """The frontier saved for (job, site), or -1 (no file, another job's, unreadable: said in the log)."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            raw = fh.read(_MAX_BYTES + 1)
    except FileNotFoundError:
        return -1
    except OSError as exc:
        log.warning("state_file %s unreadable (%s): starting as a fresh gateway", p, exc.strerror)
        return -1
    try:
        data = json.loads(raw) if len(raw) <= _MAX_BYTES else None
    except ValueError:
        data = None
    if not isinstance(data, dict) or type(data.get("frontier")) is not int or data["frontier"] < -1:
        log.warning("state_file %s is not a gateway state file: starting as a fresh gateway", p)
        return -1
    if data.get("job") != job or data.get("site") != site:
        log.warning(
            "state_file %s belongs to job %r site %r, not job %r site %r: ignored",
            p,
            data.get("job"),
            data.get("site"),
            job,
            site,
        )
        return -1
    frontier: int = data["frontier"]
    log.info("resuming job %s: this gateway had seen iteration %d (state_file %s)", job, frontier, p)
    return frontier


def save_frontier(path: str, *, job: str, site: str, frontier: int) -> None:
    """Write atomically; a failure is logged, never raised (training goes on without persistence)."""
    try:
        write_json_atomically(Path(path), {"job": job, "site": site, "frontier": frontier})
    except OSError as exc:
        log.warning("cannot write state_file %s: %s", path, exc.strerror)
