"""Timed probe trains between gateways: a receiver asks its peer for a train of padding bytes sized to be
timed at the rate it wants to test, and measures the train's tail dispersion (issue 25).

Why a probe of its own. The scheduler's bandwidth estimate comes from what the job's own messages show
(gateways/sending/rx_dispersion.py, link_times.py). A link faster than the plan's payload shows nothing:
its messages cross inside the token bucket's burst or in under ``rx_min_tail_s``, every sample is
censored, and the estimator could only raise without a measurement (docs/scheduler.md: unmeasured probes
"carried" a 100 Mbit/s link's estimate to 10-20 Gbit/s). A probe train whose size the receiver chooses
(:mod:`gateways.sending.probe_trains`: its second half lasts at least the tail threshold at the rate being
tested) is measured by the same tail-dispersion code as any message (packet-train dispersion, Dovrolis et
al., IEEE/ACM ToN 2004, §II), whatever the plan sends.

:class:`ProbeRequest` (receiver → sender, a control frame) names the train's size; :class:`ProbeTrain`
(sender → receiver, through the EDF queue at the lowest priority, so a round's bytes always go first) carries
that many padding bytes. Both bounded: a train is at most :data:`MAX_PROBE_BYTES`, checked on the request
before the sender allocates it and on the train before the receiver accepts it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Self

from wanrt.errors import LocalProtocolError
from wanrt.protocol import Message
from wanrt.protocol.checks import check_uint
from wanrt.protocol.limits import MAX_COUNTER

__all__ = ["MAX_PROBE_BYTES", "PROBE_PRIORITY", "ProbeRequest", "ProbeTrain"]

#: The largest train a gateway sends or accepts: 4 MiB is 40 ms of tail at 800 Mbit/s, far above the
#: emulated and typical WAN links this measures, and small enough to never matter to memory.
MAX_PROBE_BYTES: Final = 4 << 20

#: The EDF priority of a train's chunks: after every round message (iterations are far below this).
PROBE_PRIORITY: Final = (MAX_COUNTER, 0)


@dataclass(frozen=True, slots=True)
class ProbeRequest(Message):
    """Receiver → sender: send me probe train ``seq`` of ``nbytes`` padding bytes."""

    TYPE: ClassVar[int] = 0x83
    STREAM: ClassVar[bool] = True
    seq: int
    nbytes: int

    def __post_init__(self) -> None:
        check_uint(self.seq, "seq", MAX_COUNTER)
        check_uint(self.nbytes, "nbytes", MAX_PROBE_BYTES)
        if self.nbytes < 1:
            raise LocalProtocolError("a probe train holds at least one byte", value=self.nbytes)


@dataclass(frozen=True, slots=True)
class ProbeTrain(Message):
    """Sender → receiver: probe train ``seq``; its padding (zeros) is only there to be timed."""

    TYPE: ClassVar[int] = 0x84
    STREAM: ClassVar[bool] = True
    MAX_BUFFERS: ClassVar[int] = 1
    seq: int
    nbytes: int

    def __post_init__(self) -> None:
        check_uint(self.seq, "seq", MAX_COUNTER)
        check_uint(self.nbytes, "nbytes", MAX_PROBE_BYTES)
        if self.nbytes < 1:
            raise LocalProtocolError("a probe train holds at least one byte", value=self.nbytes)

    def to_wire(self) -> tuple[dict[str, Any], list[memoryview]]:
        return {"seq": self.seq}, [memoryview(bytes(self.nbytes))]

    @classmethod
    def from_wire(cls, header: dict[str, Any], buffers: Sequence[memoryview], *, peer: str | None) -> Self:
        if set(header) != {"seq"}:
            raise LocalProtocolError("ProbeTrain header fields wrong", value=sorted(header)[:8])
        if len(buffers) != 1:
            raise LocalProtocolError("ProbeTrain carries one padding buffer", value=len(buffers))
        return cls(seq=header["seq"], nbytes=memoryview(buffers[0]).nbytes)
