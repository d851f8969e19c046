"""The demo's sites on real network namespaces, every link shaped by a kernel ``tbf`` (:mod:`sims.netns`).
Every arm of a comparison crosses the same links.

Two layouts. ``mesh`` (default): a veth per pair of sites, each direction its own link at the rate — what
the demo's user-space links are (each gateway shapes per peer) and what ``tools/bench_round.py`` emulates.
``bridge``: each site has one access link (``wan0``) into a bridge that all its traffic to every other site
shares. Ranks of one site talk through the namespace's loopback (the intra-site network is not the
bottleneck).

The gateways of the wanrt arms run inside their site's namespace (``ip netns exec``) and dial each other
over TCP on the shaped veths; their trainers stay in the parent's namespace and reach them through the
usual unix socket (a path on the shared filesystem crosses namespaces). The real-DDP arm
(:mod:`wanrt.demo.ddp_arm`) puts its ranks inside the namespaces. The gateways' own shaping
(``[gateway.shaping.*]``: rate, delay, trace) is dropped: the kernel does the rate, and this kernel has no
``netem``, so there is **no added delay** on these links; gloo cannot be given one from user space, so
every arm runs at the same rate and zero added delay (:func:`on_netns` sets ``rtt_s = 0``).
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping, Sequence
from typing import Any, Final

from sims.netns import HUB, Emulation, Shape, cleanup_stale, probe
from sims.netns.counters import reshape_all, sent_bytes
from sims.netns.run import run
from sims.netns.topology import Topology
from wanrt.demo.config import DemoConfig, site_names
from wanrt.demo.sites.config_files import SiteFiles, toml_text
from wanrt.demo.sites.gateway_processes import GATEWAY_COMMAND, GatewayProcess, start_gateways, stop_gateways

__all__ = ["GATEWAY_PORT", "WAN_DEVICE", "NetnsSites", "netns_unavailable", "on_netns"]

#: every gateway listens on this TCP port of its own namespace (namespaces do not share ports)
GATEWAY_PORT: Final = 7700
#: a site's WAN device in the bridge topology; gloo binds to it
WAN_DEVICE: Final = "wan0"


def netns_unavailable() -> str | None:
    """Why sites cannot be put on namespaces here (None: they can): root, iproute2, tbf."""
    return probe().skip_reason()


def on_netns(cfg: DemoConfig) -> DemoConfig:
    """``cfg`` as it runs on the namespace links: no added delay or jitter (no netem: see the module
    docstring), no fluctuating trace (the kernel's rate is fixed per run)."""
    return dataclasses.replace(cfg, rtt_s=0.0, jitter_s=0.0, fluctuating=False)


def _flatten(table: Mapping[str, Any], prefix: str, out: dict[str, dict[str, Any]]) -> None:
    own: dict[str, Any] = {}
    out[prefix] = own
    for key, value in table.items():
        if isinstance(value, Mapping):
            _flatten(value, f"{prefix}.{key}", out)
        else:
            own[key] = value


class NetnsSites:
    """``with NetnsSites(sites, rate_bps) as net: Demo(cfg, out, netns=net)``; also the DDP arm's network.

    ``topology``: ``mesh`` (default: a veth per pair of sites, each direction its own ``rate_bps`` link, as
    the demo's per-peer links and ``tools/bench_round.py``) or ``bridge`` (one shared access link per
    site). Owns its :class:`~sims.netns.Emulation`: leaving the context kills what runs inside and deletes
    every namespace.

    In a mesh a site has one address per link, and gloo binds to one: each site's *home* is its address on
    its first link, and every other site gets a host route to it through their direct link, so all traffic
    between two sites crosses exactly their own shaped veth.
    """

    def __init__(
        self, sites: int, rate_bps: float, *, topology: Topology = "mesh", port: int = GATEWAY_PORT
    ) -> None:
        self.sites = sites
        self.rate_bps = rate_bps
        self.port = port
        self.topology: Topology = topology
        self.emu = Emulation(sites, topology=topology, shape=Shape(rate_bps=rate_bps))

    def __enter__(self) -> NetnsSites:
        cleanup_stale()  # namespaces of earlier runs that were killed before their teardown
        self.emu.up()
        try:
            self._route_homes()
        except BaseException:
            self.emu.down()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.emu.down()

    def _first_peer(self, site: int) -> int:
        return 1 if site == 0 else 0

    def _route_homes(self) -> None:
        if self.topology != "mesh":
            return
        for i in range(self.sites):
            for j in range(self.sites):
                if j not in (i, self._first_peer(i)):
                    via = self.emu.address(i, j)
                    run(["ip", "-n", self.emu.namespace(j), "route", "add", f"{self.home(i)}/32", "via", via])

    def home(self, site: int) -> str:
        """The one address of ``site`` every other site reaches (gloo binds to it)."""
        if self.topology == "bridge":
            return self.emu.port(site, HUB).ip
        return self.emu.address(site, self._first_peer(site))

    def wan_device(self, site: int) -> str:
        """The device that holds :meth:`home` (``GLOO_SOCKET_IFNAME``)."""
        return WAN_DEVICE if self.topology == "bridge" else f"wan{self._first_peer(site)}"

    def peer_address(self, site: int, peer: int) -> str:
        """Where ``site`` dials ``peer``: over their direct link in a mesh."""
        return self.emu.address(peer, site)

    def exec_argv(self, site: int, argv: Sequence[str]) -> list[str]:
        return self.emu.exec_argv(site, argv)

    def set_rate(self, rate_bps: float) -> None:
        """Every shaped direction to ``rate_bps`` from now on."""
        reshape_all(self.emu, Shape(rate_bps=rate_bps))
        self.rate_bps = rate_bps

    def _out_of(self, site: int) -> list[tuple[int, int]]:
        if self.topology == "bridge":
            return [(site, HUB)]
        return [(site, j) for j in range(self.sites) if j != site]

    def _into(self, site: int) -> list[tuple[int, int]]:
        if self.topology == "bridge":
            return [(HUB, site)]
        return [(j, site) for j in range(self.sites) if j != site]

    def uplink_bytes(self) -> dict[str, int]:
        """Bytes each site has sent onto the WAN so far (kernel counters, headers included)."""
        return {
            name: sum(sent_bytes(self.emu, *d) for d in self._out_of(i))
            for i, name in enumerate(site_names(self.sites))
        }

    def downlink_bytes(self) -> dict[str, int]:
        return {
            name: sum(sent_bytes(self.emu, *d) for d in self._into(i))
            for i, name in enumerate(site_names(self.sites))
        }

    # -- the gateways of the wanrt arms ----------------------------------------------------------------

    def adapt_run_files(self, files: Sequence[SiteFiles]) -> None:
        """Rewrite the demo's gateway configs for the namespaces: the WAN on TCP over the veths, no
        user-space shaping; the trainer socket stays where it was."""
        names = [f.site for f in files]
        for f in files:
            with f.config.open("rb") as fh:
                doc = tomllib.load(fh)
            gw = doc["gateway"]
            gw["listen"] = f"tcp://0.0.0.0:{self.port}"
            me = names.index(f.site)
            gw["peers"] = {
                p: f"tcp://{self.peer_address(me, names.index(p))}:{self.port}" for p in gw["peers"]
            }
            gw.pop("shaping", None)
            tables: dict[str, dict[str, Any]] = {}
            _flatten(gw, "gateway", tables)
            f.config.write_text(
                f"# wanrt demo: gateway of site {f.site!r} in network namespace "
                f"{self.emu.namespace(names.index(f.site))} (written by wanrt.demo.netns_sites)\n"
                + toml_text(tables)
            )

    def start_gateways(
        self, files: Sequence[SiteFiles], *, command: Sequence[str] = GATEWAY_COMMAND
    ) -> list[GatewayProcess]:
        """Each site's gateway inside its namespace (``ip netns exec`` execs: the pid is the daemon's)."""
        out: list[GatewayProcess] = []
        try:
            for i, f in enumerate(files):
                out += start_gateways([f], command=self.exec_argv(i, command))
        except BaseException:
            stop_gateways(out)
            raise
        return out
