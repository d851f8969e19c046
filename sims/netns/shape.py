"""One direction of an emulated link, and the ``tc`` commands that realise it on a veth's egress.

Pure functions, no I/O: the commands are built here and run by :mod:`sims.netns.topology`, so they can be
unit-tested on any machine. Rate limiting is always ``tbf`` (present in every kernel we target). Delay,
jitter and loss need ``netem``; when the kernel lacks it, delay and jitter move up into wanrt's own
:class:`transports.ShapedTransport` (see :func:`transport_query`), and loss cannot be emulated at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from sims.netns.run import NetemUnavailable
from wanrt.config import check

__all__ = [
    "MIN_TBF_BURST",
    "NETEM_MISSING",
    "Shape",
    "kernel_part",
    "layout",
    "netem_missing_reason",
    "qdisc_commands",
    "transport_query",
]

#: Smallest tbf bucket. It must hold at least one full-size packet (a veth hands tbf GSO super-packets that
#: tbf splits only when they exceed the bucket, costing CPU), and a bucket below rate × (timer slack) loses
#: tokens on a loaded machine, delivering less than the rate.
MIN_TBF_BURST: Final = 32 * 1024

#: tbf bucket as time at the configured rate, when more than the floor above (5 ms: a few timer ticks).
TBF_BURST_WINDOW_S: Final = 0.005

#: netem's queue, in packets. Its default of 1000 is smaller than rate × delay on a fast, long link (1 Gbit/s
#: × 50 ms ≈ 4300 packets) and would drop packets the user never asked to lose.
NETEM_LIMIT_PACKETS: Final = 100_000

#: The skip reason of netem-only tests and the answer of the capability probe on such kernels.
NETEM_MISSING: Final = "kernel has no netem qdisc"


@dataclass(frozen=True)
class Shape:
    """One direction of a link. ``rate_bps`` = inf means no rate limit.

    ``latency_s`` is tbf's queue bound: a packet that would wait longer is dropped, so the bottleneck buffer
    is ``rate × latency`` (50 ms: a typical WAN router buffer, and TCP sees the queueing delay it would see
    there). ``burst`` = None picks :meth:`tbf_burst`. ``delay_s``/``jitter_s``/``loss`` are netem's; loss is
    a fraction in [0, 1).
    """

    rate_bps: float = math.inf
    burst: int | None = None
    latency_s: float = 0.05
    delay_s: float = 0.0
    jitter_s: float = 0.0
    loss: float = 0.0

    def __post_init__(self) -> None:
        check(self.rate_bps > 0 and not math.isnan(self.rate_bps), "rate_bps", self.rate_bps, "must be > 0")
        check(
            math.isinf(self.rate_bps) or self.rate_bps >= 8_000,
            "rate_bps",
            self.rate_bps,
            "must be >= 8 kbit/s",
        )
        check(self.burst is None or self.burst >= 1600, "burst", self.burst, "must hold a packet (>= 1600 B)")
        check(
            0 < self.latency_s <= 10 and math.isfinite(self.latency_s),
            "latency_s",
            self.latency_s,
            "must be in (0, 10] s",
        )
        check(
            0 <= self.delay_s <= 10 and math.isfinite(self.delay_s),
            "delay_s",
            self.delay_s,
            "must be in [0, 10] s",
        )
        check(
            0 <= self.jitter_s <= 10 and math.isfinite(self.jitter_s),
            "jitter_s",
            self.jitter_s,
            "must be in [0, 10] s",
        )
        check(0 <= self.loss < 1, "loss", self.loss, "must be a fraction in [0, 1)")

    @property
    def limited(self) -> bool:
        return not math.isinf(self.rate_bps)

    @property
    def needs_netem(self) -> bool:
        """True when the kernel would need netem to apply this shape by itself."""
        return self.delay_s > 0 or self.jitter_s > 0 or self.loss > 0

    def tbf_burst(self) -> int:
        if self.burst is not None:
            return self.burst
        return max(MIN_TBF_BURST, int(self.rate_bps * TBF_BURST_WINDOW_S / 8))


def netem_missing_reason(stderr: str) -> str:
    """Why ``tc qdisc add ... netem`` failed, in words a skip message can carry."""
    text = stderr.strip()
    low = text.lower()
    if "specified qdisc kind is unknown" in low or "no such file or directory" in low:
        # The first is the kernel's extack message; the second what older kernels said when sch_netem
        # could not be loaded.
        return NETEM_MISSING
    if 'unknown qdisc "netem"' in low:
        return "tc was built without netem support"
    return f"netem probe failed: {text or 'no error text'}"


def kernel_part(shape: Shape, *, netem: bool) -> Shape:
    """What the kernel applies of ``shape``: all of it with netem; without, the tbf rate only.

    Raises NetemUnavailable for packet loss without netem: wanrt's streams are reliable, so there is no
    faithful place above the kernel to drop packets, and ignoring the request would make results lie.
    """
    if netem or not shape.needs_netem:
        return shape
    if shape.loss > 0:
        raise NetemUnavailable(f"{NETEM_MISSING}: packet loss ({shape.loss:.2%}) cannot be emulated")
    return Shape(rate_bps=shape.rate_bps, burst=shape.burst, latency_s=shape.latency_s)


def _us(seconds: float) -> str:
    return f"{round(seconds * 1e6)}us"


def _tbf(shape: Shape) -> list[str]:
    return [
        "tbf",
        "rate",
        f"{round(shape.rate_bps)}bit",
        "burst",
        str(shape.tbf_burst()),
        "latency",
        _us(shape.latency_s),
    ]


def _netem(shape: Shape) -> list[str]:
    args = ["netem", "limit", str(NETEM_LIMIT_PACKETS)]
    if shape.delay_s > 0 or shape.jitter_s > 0:
        args += ["delay", _us(shape.delay_s)]
        if shape.jitter_s > 0:
            args.append(_us(shape.jitter_s))
    if shape.loss > 0:
        args += ["loss", f"{shape.loss * 100:.6g}%"]
    return args


def qdisc_commands(dev: str, shape: Shape, *, verb: str = "add") -> list[list[str]]:
    """``tc`` argument lists (without ``tc -n NS``) that give ``dev``'s egress ``shape``.

    ``shape`` must already be the kernel part (:func:`kernel_part`). Layout: tbf alone at the root
    (handle 1:); with netem, netem at the root and tbf as its child (the layout of tc-netem(8)), so delayed
    packets are still paced. ``verb`` is ``add`` on a fresh device, ``change`` to retune a device that
    already has this layout (a rate change then keeps the queued packets). An unshaped direction is an
    empty list (the device keeps its default qdisc).
    """
    if verb not in ("add", "change"):
        raise ValueError(f"verb must be 'add' or 'change', not {verb!r}")
    if shape.needs_netem:
        cmds = [["qdisc", verb, "dev", dev, "root", "handle", "1:", *_netem(shape)]]
        if shape.limited:
            cmds.append(["qdisc", verb, "dev", dev, "parent", "1:1", "handle", "10:", *_tbf(shape)])
        return cmds
    if shape.limited:
        return [["qdisc", verb, "dev", dev, "root", "handle", "1:", *_tbf(shape)]]
    return []


def layout(shape: Shape) -> tuple[bool, bool]:
    """(netem at the root, tbf present): two kernel parts with one layout can be ``change``d in place."""
    return shape.needs_netem, shape.limited


def transport_query(delay_s: float, jitter_s: float) -> str:
    """The URL query that makes :class:`transports.ShapedTransport` add what netem could not.

    ``rate=inf`` because the rate is tbf's job (LinkShape's default would cap the link at 100 Mbit/s). Empty
    when there is nothing to add.
    """
    if delay_s <= 0 and jitter_s <= 0:
        return ""
    query = f"rate=inf&delay={delay_s!r}"
    if jitter_s > 0:
        query += f"&jitter={jitter_s!r}"
    return query
