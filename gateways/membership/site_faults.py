"""What this gateway knows of other sites' failures, and what it has told its trainer about them.

Reliability: a site that cannot train (its trainer runs another model) must not leave the other sites
waiting for their update deadline with a hint that guesses. The failing site's gateway says why on every
link (:class:`~wanrt.protocol.peer.site_fault.SiteFault`); every gateway records it once, forwards it once,
and
hands its trainer a :class:`~wanrt.protocol.Notice` — also to a trainer that connects later.

Fatal or not. A model fault stops the other sites' trainers only while this gateway has not yet taken
part in a round (a job misconfigured at start-up: every site gets ``ModelMismatch``, whichever started
first). Once the job is running, a mistaken trainer started at one site must not stop the job everywhere:
the others get a warning and go on (the missing-rounds warning says who is absent). Connection refusals
(a gateway or trainer with a wrong secret, other round settings) come from unauthenticated or refused
parties, so they are only ever warnings, at most one per (site, kind) per ``repeat_s``. Sans-IO.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Final

from wanrt.protocol import Notice
from wanrt.protocol.peer.site_fault import SiteFault

__all__ = ["SiteFaults"]

#: Faults and warnings kept (for /status and for trainers that connect later): older ones are dropped.
MAX_KEPT: Final = 32


class SiteFaults:
    def __init__(self, site: str, *, repeat_s: float = 30.0) -> None:
        self.site = site
        self.repeat_s = repeat_s
        #: accepted faults by the site they are about (at most one per site: the first reason is kept)
        self.faults: OrderedDict[str, tuple[SiteFault, bool]] = OrderedDict()
        #: warnings by (site, kind): the last notice and when it was last handed out
        self.warnings: OrderedDict[tuple[str, str], tuple[Notice, float]] = OrderedDict()

    def own(self, fault: SiteFault) -> bool:
        """A fault of this site (raised here): recorded; False if one is already recorded."""
        return self._record(fault, fatal=True)

    def accept(self, fault: SiteFault, *, from_peer: str, live_peers: set[str], fatal: bool) -> bool:
        """A fault received from ``from_peer``: whether it is new and may be acted on (forwarded, told).

        A fault about this site is never taken from a peer; one about a site we have a live link to is
        taken only from that site itself (it could have told us directly: a relay claiming it is not
        believed)."""
        if fault.site == self.site:
            return False
        if from_peer != fault.site and fault.site in live_peers:
            return False
        return self._record(fault, fatal=fatal)

    def _record(self, fault: SiteFault, *, fatal: bool) -> bool:
        if fault.site in self.faults:
            return False
        self.faults[fault.site] = (fault, fatal)
        while len(self.faults) > MAX_KEPT:
            self.faults.popitem(last=False)
        return True

    def notice(self, fault: SiteFault) -> Notice:
        """What this gateway's trainer is told of ``fault``."""
        _, fatal = self.faults.get(fault.site, (fault, True))
        return Notice(fault.site, fault.kind, fault.message, fatal, dict(fault.info))

    def warn(self, site: str, kind: str, message: str, now: float) -> Notice | None:
        """A warning for this gateway's trainer, or ``None`` if the same (site, kind) was told less than
        ``repeat_s`` ago (a flood of bad connections must not flood the trainer's log)."""
        key = (site, kind)
        last = self.warnings.get(key)
        if last is not None and now - last[1] < self.repeat_s:
            return None
        notice = Notice(site, kind, message, False)
        self.warnings[key] = (notice, now)
        self.warnings.move_to_end(key)
        while len(self.warnings) > MAX_KEPT:
            self.warnings.popitem(last=False)
        return notice

    def clear_warnings(self, kind: str, keep: set[str]) -> None:
        """Drop the warnings of ``kind`` about sites not in ``keep``: a condition that ended (the site
        contributes again) must not stay listed in /status (issue 21: "rounds complete without site a
        (2300 in a row)" stayed under ``faults`` after it was over)."""
        for key in [k for k in self.warnings if k[1] == kind and k[0] not in keep]:
            del self.warnings[key]

    def replay(self) -> list[Notice]:
        """For a trainer that connects now: every recorded fault, then the recent warnings."""
        return [self.notice(f) for f, _ in self.faults.values()] + [n for n, _ in self.warnings.values()]

    def status(self) -> list[dict[str, Any]]:
        return [
            {"site": f.site, "kind": f.kind, "message": f.message, "fatal": fatal}
            for f, fatal in self.faults.values()
        ] + [
            {"site": n.site, "kind": n.kind, "message": n.message, "fatal": False}
            for n, _ in self.warnings.values()
        ]
