"""How the demo reports a child that failed: one error naming the child, with the tail of its log.

The demo runs a dozen processes; when one dies the others block on it (a gateway waits for a site, a site
waits for its leader), so the useful report is not "timed out" but "trainer b/1 exited with code 1" followed
by the last lines it wrote.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from wanrt.errors import WanrtError

__all__ = ["DemoFailed", "log_tail"]

#: enough lines for a Python traceback, few enough to read in a terminal
TAIL_LINES: Final = 25
#: a runaway log must not be read whole just to show its end
TAIL_BYTES: Final = 64 * 1024


def log_tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of ``path`` (at most its last 64 KiB), or a note that it is missing."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - TAIL_BYTES))
            text = fh.read().decode(errors="replace")
    except OSError as exc:
        return f"(no log at {path}: {exc.strerror})"
    tail = text.splitlines()[-lines:]
    return "\n".join(tail) if tail else f"(log {path} is empty)"


class DemoFailed(WanrtError):
    """A child process of the demo failed (or the run stalled); ``child`` names it, ``log`` is its log."""

    def __init__(self, message: str, *, child: str, log: Path | None = None) -> None:
        text = message
        if log is not None:
            body = "\n".join("    " + line for line in log_tail(log).splitlines())
            text = f"{message}\n  last lines of {log}:\n{body}"
        super().__init__(text, child=child)
        self.log_path = log

    def __str__(self) -> str:
        return self.message
