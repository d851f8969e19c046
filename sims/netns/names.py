"""Namespace names, and finding and deleting the namespaces the harness made.

Every namespace is ``wanrt-<tag>-<role>``. A harness run picks ``tag = p<pid>x<random>``: unique across
parallel runs, and the pid tells a later run whether the creator is still alive, so the leftovers of a
crashed run (SIGKILL, OOM) can be removed without touching a live run's. Manual setups made with
``tools/netem.py up --tag NAME`` use a plain name and are only removed by ``down``.
"""

from __future__ import annotations

import os
import re
import secrets
import select
import signal
import time
from typing import Final

from sims.netns.run import NetnsError, run
from wanrt.errors import ConfigError

__all__ = [
    "PREFIX",
    "auto_tag",
    "check_tag",
    "cleanup_stale",
    "delete_namespace",
    "list_namespaces",
    "namespace_pids",
    "stop_processes",
    "tagged",
]

PREFIX: Final = "wanrt-"
_AUTO = re.compile(r"p(\d+)x[0-9a-f]+")
_MANUAL = re.compile(r"[a-z][a-z0-9]{0,15}")

#: How long processes left in a namespace get to exit after SIGKILL before teardown reports them.
KILL_WAIT_S: Final = 5.0


def auto_tag() -> str:
    return f"p{os.getpid()}x{secrets.token_hex(3)}"


def check_tag(tag: str) -> str:
    """A manual tag: short lowercase letters/digits, and never mistakable for a harness run's tag."""
    if not (_AUTO.fullmatch(tag) or _MANUAL.fullmatch(tag)):
        raise ConfigError(
            f"tag {tag!r} must be 1-16 of [a-z0-9], starting with a letter", key="tag", value=tag
        )
    return tag


def list_namespaces() -> list[str]:
    """All network namespace names (``ip netns list`` prints ``name`` or ``name (id: N)``)."""
    _, out, _ = run(["ip", "netns", "list"])
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def tagged(tag: str) -> list[str]:
    return [ns for ns in list_namespaces() if ns.startswith(f"{PREFIX}{tag}-")]


def namespace_pids(ns: str) -> list[int]:
    rc, out, _ = run(["ip", "netns", "pids", ns], check=False)
    return [int(p) for p in out.split()] if rc == 0 else []


def _kill_and_wait(pid: int, timeout_s: float) -> bool:
    """SIGKILL ``pid`` through a pidfd (immune to pid reuse) and wait for it to exit; False on timeout."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        poller = select.poll()
        poller.register(fd, select.POLLIN)  # a pidfd becomes readable when the process exits
        return bool(poller.poll(max(0.0, timeout_s) * 1000))
    except ProcessLookupError:
        return True
    finally:
        os.close(fd)


def stop_processes(ns: str) -> None:
    """Kill, by pid, the processes still running inside ``ns`` (a namespace this harness created, so they
    are ours), and wait until they are gone: a namespace with live processes outlives ``ip netns del``."""
    deadline = time.monotonic() + KILL_WAIT_S
    while pids := namespace_pids(ns):
        for pid in pids:
            if not _kill_and_wait(pid, deadline - time.monotonic()):
                raise NetnsError(
                    f"process {pid} in {ns} did not exit after SIGKILL", cmd=f"ip netns pids {ns}"
                )


def delete_namespace(ns: str) -> None:
    """Delete ``ns`` (its veths go with it, and so do their peers); a missing namespace is not an error."""
    stop_processes(ns)
    rc, _, err = run(["ip", "netns", "del", ns], check=False)
    if rc != 0 and ns in list_namespaces():
        raise NetnsError(f"could not delete namespace {ns}", cmd=f"ip netns del {ns}", stderr=err.strip())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_stale() -> list[str]:
    """Delete namespaces of harness runs whose process is gone; return their names."""
    removed = []
    for ns in list_namespaces():
        if not ns.startswith(PREFIX):
            continue
        m = _AUTO.match(ns[len(PREFIX) :])
        if m is None or _alive(int(m.group(1))):
            continue
        delete_namespace(ns)
        removed.append(ns)
    return removed
