"""The demo's sites on real network namespaces: one namespace per site, joined through a bridge, each site's
WAN link shaped by a kernel ``tbf`` (:mod:`sims.netns`). Every arm of a comparison crosses the same links.

Why a bridge: a site has one WAN access link (``wan0``, 100 Mbit/s each way by default) that all its traffic
to every other site shares, as a real site's uplink. Ranks of one site talk through the namespace's
loopback (the intra-site network is not the bottleneck). Addresses: site i is ``10.213.0.(i+1)``.

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

    Owns its :class:`~sims.netns.Emulation`: leaving the context kills what runs inside and deletes every
    namespace.
    """

    def __init__(self, sites: int, rate_bps: float, *, port: int = GATEWAY_PORT) -> None:
        self.sites = sites
        self.rate_bps = rate_bps
        self.port = port
        self.emu = Emulation(sites, topology="bridge", shape=Shape(rate_bps=rate_bps))

    def __enter__(self) -> NetnsSites:
        cleanup_stale()  # namespaces of earlier runs that were killed before their teardown
        self.emu.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.emu.down()

    def address(self, site: int) -> str:
        return self.emu.port(site, HUB).ip

    def exec_argv(self, site: int, argv: Sequence[str]) -> list[str]:
        return self.emu.exec_argv(site, argv)

    def set_rate(self, rate_bps: float) -> None:
        """Every site's uplink and downlink to ``rate_bps`` from now on."""
        reshape_all(self.emu, Shape(rate_bps=rate_bps))
        self.rate_bps = rate_bps

    def uplink_bytes(self) -> dict[str, int]:
        """Bytes each site has sent onto the WAN so far (kernel counters, headers included)."""
        return {name: sent_bytes(self.emu, i, HUB) for i, name in enumerate(site_names(self.sites))}

    def downlink_bytes(self) -> dict[str, int]:
        return {name: sent_bytes(self.emu, HUB, i) for i, name in enumerate(site_names(self.sites))}

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
            gw["peers"] = {p: f"tcp://{self.address(names.index(p))}:{self.port}" for p in gw["peers"]}
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
