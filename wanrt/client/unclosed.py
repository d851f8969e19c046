"""The warning a trainer gets when it exits without ``ctx.close()``, and what that costs.

``close()`` is where a site applies the updates still in flight (the last iteration's aggregates: a layer
may arrive one iteration late, partial staleness ≤ 1) and says Bye to its gateway. A trainer that forgets
it exits 0 with parameters that miss those updates, so they differ from every other site's (issue 21:
"forgot ``ctx.close()``: exit 0 at both sites, no warning, final parameters differ"). Worse, its last
pushes could still sit in the link's send queue when the process ended, and the other sites then waited
for them until their update deadline (the probe, tools/chaos_probes.py, saw site a time out after 30 s).

Applying the updates at interpreter exit is not safe: ``close`` is collective, and a rank that exits
because another failed would hang in it. What is safe is the leader's own part: finish the pushes already
handed to the worker and close the link (flush, Bye), bounded by ``close_timeout_s``, so no other site
waits. So at exit the leader does that, and warns, naming the consequence for this site's parameters.
"""

from __future__ import annotations

import atexit
import logging
import warnings
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from wanrt.client.leader.worker import LeaderPipeline
    from wanrt.client.link.api import Link

__all__ = ["UnclosedContextWarning", "leave_quietly", "watch_unclosed"]

log = logging.getLogger(__name__)


class UnclosedContextWarning(UserWarning):
    """A wanrt context was never closed: its site's last updates were not applied."""


class _Watched(Protocol):
    site: str

    @property
    def unclosed_steps(self) -> int: ...

    def leave_at_exit(self) -> None: ...


def watch_unclosed(ctx: _Watched) -> Callable[[], None]:
    """Warn at interpreter exit if ``ctx`` is still open and trained (held weakly); returns the function
    that cancels the watch (``close()`` calls it)."""
    ref = weakref.ref(ctx)

    def at_exit() -> None:
        live = ref()
        if live is None or live.unclosed_steps <= 0:
            return
        warnings.warn(
            f"wanrt: site {live.site} exits after {live.unclosed_steps} iterations without ctx.close(): "
            "its last pushes were delivered (the other sites do not wait for them), but the updates still "
            "in flight (the last iteration's aggregates) were not applied, so this site's final "
            "parameters differ from the other sites'. Call ctx.close() on every rank after the training "
            "loop (or use `with wanrt.init(...) as ctx:`).",
            UnclosedContextWarning,
            stacklevel=1,
        )
        live.leave_at_exit()

    atexit.register(at_exit)
    return lambda: atexit.unregister(at_exit)


def leave_quietly(pipeline: LeaderPipeline | None, link: Link | None, timeout_s: float) -> None:
    """The leader's non-collective part of a close, at interpreter exit: finish the pushes handed to the
    worker, flush the link and say Bye, so no other site waits for them. Every failure is only logged: the
    process is exiting anyway."""
    try:
        if pipeline is not None:
            pipeline.close()
        if link is not None:
            link.close(timeout_s)
    except Exception as exc:  # at exit: nothing left to tell but the log
        log.warning("leaving at exit: %s", exc)
