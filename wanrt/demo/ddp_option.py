"""``wanrt demo --ddp``: add a real-DDP arm and put every arm on network-namespace links.

Off by default, because it needs root (namespaces, ``tc``). With it, the sites become namespaces joined
pairwise by veths, ``tbf`` at ``--bandwidth`` on each direction of every link (:mod:`wanrt.demo.netns_sites`),
the gateways run inside them, and the DDP ranks (:mod:`wanrt.demo.ddp_arm`) too. The kernel has no ``netem``
here and gloo cannot be delayed from user space, so with ``--ddp`` every arm runs with **no added delay** and
no fluctuating trace (:func:`~wanrt.demo.netns_sites.on_netns`); the demo says so when it starts. The DDP
ranks boot while the demo's trainers boot; their clock starts when they are all connected.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from wanrt.demo.config import DemoConfig
from wanrt.errors import ConfigError

if TYPE_CHECKING:
    from wanrt.demo.ddp_arm import DdpJob
    from wanrt.demo.netns_sites import NetnsSites

__all__ = ["ENABLE_HINT", "DdpSetup", "add_ddp_argument", "ddp_setup"]

ENABLE_HINT = (
    "real-DDP baseline: add --ddp (needs root, iproute2 and the tbf qdisc: every arm then runs on "
    "network-namespace links)"
)


def add_ddp_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--ddp",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also train with real PyTorch DDP (gloo all-reduce across every rank of every site) and put "
        "every arm on network-namespace links shaped by tc tbf, without added delay; needs root "
        "(default off)",
    )


@dataclass
class DdpSetup:
    """What ``--ddp`` changes: the config every arm runs with, the namespaces, the booted DDP ranks."""

    cfg: DemoConfig
    net: NetnsSites | None = None
    job: DdpJob | None = None


@contextlib.contextmanager
def ddp_setup(
    args: argparse.Namespace, cfg: DemoConfig, out: Path, say: Callable[[str], None] = print
) -> Iterator[DdpSetup]:
    """Without ``--ddp``: ``cfg`` unchanged, nothing started. With it: the namespaces up and the DDP ranks
    booting; both are torn down on leaving (also on an error or Ctrl-C)."""
    if not getattr(args, "ddp", None):
        yield DdpSetup(cfg)
        return
    from wanrt.demo.ddp_arm import DdpJob
    from wanrt.demo.netns_sites import NetnsSites, netns_unavailable, on_netns

    reason = netns_unavailable()
    if reason is not None:
        raise ConfigError(
            f"--ddp needs network namespaces, which this machine cannot give: {reason}. Run as root on "
            "Linux with iproute2 (ip, tc) and the tbf qdisc, or leave out --ddp",
            key="--ddp",
            value=True,
        )
    moved = on_netns(cfg)
    say(
        f"--ddp: every arm on namespace links, tbf {moved.bandwidth_bps / 1e6:g} Mbit/s on each direction of "
        "every link between two sites, no added delay (this kernel has no netem) and no fluctuating trace"
    )
    with (
        NetnsSites(moved.sites, moved.bandwidth_bps) as net,
        DdpJob(moved, net, out, label="ddp", on_line=say) as job,
    ):
        yield DdpSetup(moved, net, job)
