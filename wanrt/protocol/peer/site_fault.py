"""A site's failure, told to every other gateway so their trainers hear of it within seconds.

Without it a healthy site only learns that another site is broken when its trainer's update deadline
expires (minutes), with a hint that guesses. The gateway of the failing site knows the reason (its
trainer runs another model), so it says so on every link; each gateway forwards it once to the links
that did not bring it and hands it to its trainer as a :class:`~wanrt.protocol.Notice`.

What a peer may claim is bounded by its place: a fault names the site it is about, and a gateway accepts
it from that site's own link, or relayed by another link only when it has no live link to that site
(then the site could not have told it directly). Only ``model`` faults travel between gateways; they
stop trainers, so they are only ever raised by the gateway whose own authenticated trainer presented a
model other than the job's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from wanrt.errors import LocalProtocolError
from wanrt.protocol import Message
from wanrt.protocol.checks import check_name, check_scalar_map, check_text
from wanrt.protocol.limits import MAX_INFO_KEYS

__all__ = ["FAULT_KINDS", "SiteFault"]

#: Faults that travel between gateways (see the module docstring): ``model`` (may stop trainers at
#: start-up) and ``trainer_auth`` (a trainer failed to authenticate at its own gateway: only ever a warning,
#: since an unauthenticated connection caused it, and only believed from that site's own link) and
#: ``trainer_gone`` (its trainer died: the job trains on without its data; a warning, from its own link).
FAULT_KINDS = ("model", "trainer_auth", "trainer_gone")


@dataclass(frozen=True, slots=True)
class SiteFault(Message):
    """Gateway → gateway: site ``site`` cannot train as configured, because ``message``; ``info`` carries
    the model signature its trainer presented, so other sites can name the first differing layer."""

    TYPE: ClassVar[int] = 0x82
    STREAM: ClassVar[bool] = True
    site: str
    kind: str
    message: str
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_name(self.site, "site")
        if self.kind not in FAULT_KINDS:
            raise LocalProtocolError("unknown site fault kind", value=str(self.kind)[:32])
        check_text(self.message, "message")
        object.__setattr__(
            self,
            "info",
            check_scalar_map(self.info, "info", "MAX_INFO_KEYS", MAX_INFO_KEYS, allow_bytes=True),
        )
