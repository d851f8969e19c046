"""Running ``ip`` and ``tc``: one place that turns a failed command into a typed error with its stderr.

The harness shells out rather than speaking netlink itself: iproute2 is what operators use by hand, so a
failing step can be replayed verbatim from the error message, and there is no extra dependency.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Sequence
from typing import Final

from wanrt.errors import WanrtError

__all__ = ["COMMAND_TIMEOUT_S", "NetemUnavailable", "NetnsError", "run"]

#: One ``ip``/``tc`` call normally takes milliseconds; a call that hangs this long means a wedged kernel or
#: a lock held by a crashed run, and the caller is better off with an error than a stuck test.
COMMAND_TIMEOUT_S: Final = 15.0


class NetnsError(WanrtError):
    """An ``ip``/``tc`` command failed; ``cmd`` is the command line (copy-pastable), ``stderr`` its words."""

    def __init__(self, message: str, *, cmd: str | None = None, stderr: str | None = None) -> None:
        super().__init__(message, cmd=cmd, stderr=stderr)


class NetemUnavailable(NetnsError):
    """A shape asks for something only netem can do in the kernel (packet loss) and netem is missing."""


def run(
    argv: Sequence[str], *, check: bool = True, timeout: float = COMMAND_TIMEOUT_S
) -> tuple[int, str, str]:
    """Run ``argv``, return ``(returncode, stdout, stderr)``; ``check``: NetnsError on a non-zero exit."""
    cmd = shlex.join(argv)
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise NetnsError(f"{argv[0]} not found (install iproute2)", cmd=cmd) from None
    except subprocess.TimeoutExpired:
        raise NetnsError(f"command did not finish within {timeout} s", cmd=cmd) from None
    if check and proc.returncode != 0:
        raise NetnsError(
            f"command failed with exit code {proc.returncode}", cmd=cmd, stderr=proc.stderr.strip()
        )
    return proc.returncode, proc.stdout, proc.stderr
