"""Build, inspect and remove an emulated WAN of network namespaces by hand (needs root and iproute2).

    python tools/netem.py up --sites 3 --rate 100mbit [--topology mesh|bridge] [--delay 20ms] [--jitter 2ms]
                             [--loss 0.5%] [--latency 50ms] [--burst 64KiB] [--tag lab]
    python tools/netem.py status
    python tools/netem.py down [--tag lab | --stale | --all]

``up`` leaves the namespaces in place (``wanrt-<tag>-s<i>``, plus ``wanrt-<tag>-hub`` with a bridge) and
prints where each site is reachable, the qdiscs, and - when the kernel has no netem - the URL query that
makes wanrt's ShapedTransport add the delay. Run programs inside with ``ip netns exec wanrt-lab-s0 ...``.
See docs/emulation.md.
"""

from __future__ import annotations

import argparse
import itertools
import sys

from sims.netns import HUB, Emulation, NetnsError, Shape, cleanup_stale, list_namespaces, probe
from sims.netns.names import PREFIX, delete_namespace, tagged
from sims.netns.run import run
from transports.urls import parse_bytes, parse_duration, parse_rate
from wanrt.errors import ConfigError


def _loss(text: str) -> float:
    text = text.strip()
    try:
        return float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise ConfigError(
            f"loss: {text!r} is not a fraction or a percentage", key="loss", value=text
        ) from None


def _shape(args: argparse.Namespace) -> Shape:
    return Shape(
        rate_bps=parse_rate(args.rate),
        burst=parse_bytes(args.burst) if args.burst else None,
        latency_s=parse_duration(args.latency, "latency"),
        delay_s=parse_duration(args.delay),
        jitter_s=parse_duration(args.jitter, "jitter"),
        loss=_loss(args.loss),
    )


def cmd_up(args: argparse.Namespace) -> int:
    emu = Emulation(args.sites, topology=args.topology, shape=_shape(args), tag=args.tag)
    emu.up()
    print(f"up: {emu.sites} sites ({emu.topology}), tag {emu.tag}; {emu.caps.summary()}")
    for i in range(emu.sites):
        peers = ", ".join(f"s{j} at {emu.address(j, i)}" for j in range(emu.sites) if j != i)
        print(f"  {emu.namespace(i)}: reaches {peers}")
    directions = (
        itertools.permutations(range(emu.sites), 2)
        if emu.topology == "mesh"
        else itertools.chain.from_iterable(((i, HUB), (HUB, i)) for i in range(emu.sites))
    )
    for src, dst in directions:
        port = emu.port(src, dst)
        print(f"  {port.ns} {port.dev}: {emu.qdiscs(src, dst).strip() or 'unshaped'}")
    for src, dst in itertools.permutations(range(emu.sites), 2):
        if query := emu.transport_query(src, dst):
            print(f"  no netem: s{src} -> s{dst} needs ShapedTransport ?{query}")
    print(f"remove with: python tools/netem.py down --tag {emu.tag}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    if args.stale:
        names = cleanup_stale()
    else:
        names = [n for n in list_namespaces() if n.startswith(PREFIX)] if args.all else tagged(args.tag)
        for ns in names:
            delete_namespace(ns)
    print(f"removed {len(names)} namespace(s){': ' + ' '.join(names) if names else ''}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    print(probe().summary())
    names = [n for n in list_namespaces() if n.startswith(PREFIX)]
    if not names:
        print("no wanrt namespaces")
    for ns in sorted(names):
        print(ns)
        for line in run(["ip", "-n", ns, "-brief", "addr"])[1].splitlines():
            print(f"  addr  {line}")
        for line in run(["tc", "-n", ns, "qdisc", "show"])[1].splitlines():
            if "noqueue" not in line:
                print(f"  {line}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="build namespaces and shaped links, and leave them up")
    up.add_argument("--sites", type=int, default=2)
    up.add_argument("--topology", choices=("mesh", "bridge"), default="mesh")
    up.add_argument("--rate", default="inf", help="tbf rate per direction, e.g. 100mbit (default: unshaped)")
    up.add_argument("--burst", default="", help="tbf bucket, e.g. 64KiB (default: max(32 KiB, 5 ms of rate))")
    up.add_argument("--latency", default="50ms", help="tbf queue bound (bottleneck buffer = rate x latency)")
    up.add_argument("--delay", default="0", help="one-way delay per direction (netem, else ShapedTransport)")
    up.add_argument("--jitter", default="0")
    up.add_argument("--loss", default="0", help="packet loss, e.g. 0.5%% (needs netem)")
    up.add_argument("--tag", default="lab", help="namespace names are wanrt-<tag>-s<i>")
    down = sub.add_parser("down", help="remove namespaces (and with them veths and qdiscs)")
    which = down.add_mutually_exclusive_group()
    which.add_argument("--tag", default="lab")
    which.add_argument("--stale", action="store_true", help="only those of crashed test runs")
    which.add_argument("--all", action="store_true", help="every wanrt-* namespace")
    sub.add_parser("status", help="what the kernel can do, and the wanrt namespaces with their qdiscs")
    args = p.parse_args(argv)
    try:
        return {"up": cmd_up, "down": cmd_down, "status": cmd_status}[args.cmd](args)
    except (NetnsError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
