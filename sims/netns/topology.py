"""N sites in network namespaces, joined pairwise (mesh) or through a hub namespace with a bridge, with
per-direction shaping on every veth's egress. A context manager: leaving it, also by an exception, kills
what runs inside and deletes every namespace (their veths go with them).

Addresses are private and exist only on veths inside these namespaces; no namespace gets a default route,
so emulated traffic cannot leave them. Mesh: pair k = (i, j), i < j, is ``10.213.k.0/30`` (i is .1, j .2).
Bridge: site i is ``10.213.0.(i+1)/24`` on its ``wan0``; the hub has no address.

Direction ``(src, dst)`` is shaped on src's end of their veth (mesh), or on the site's ``wan0`` for
``(i, HUB)`` (uplink) and the hub's port ``s<i>`` for ``(HUB, i)`` (downlink) with a bridge, where a path
i → j crosses i's uplink and j's downlink.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Final, Literal, Self

from sims.netns.caps import Capabilities, probe
from sims.netns.names import PREFIX, auto_tag, check_tag, delete_namespace, tagged
from sims.netns.run import NetnsError, run
from sims.netns.shape import Shape, kernel_part, layout, qdisc_commands, transport_query
from wanrt.errors import ConfigError

__all__ = ["HUB", "MAX_BRIDGE_SITES", "MAX_MESH_SITES", "Emulation", "Port"]

#: The hub namespace of a bridge topology, as a site index in directions: ``(i, HUB)`` is i's uplink.
HUB: Final = -1
#: A mesh has n(n-1)/2 veth pairs, one /30 each out of 10.213.0.0/16's 256 third octets.
MAX_MESH_SITES: Final = 16
#: A bridge puts every site in one /24.
MAX_BRIDGE_SITES: Final = 250

Topology = Literal["mesh", "bridge"]


@dataclass(frozen=True)
class Port:
    """One end of a veth: the namespace, the device name there, and its address (None on a bridge port)."""

    ns: str
    dev: str
    cidr: str | None

    @property
    def ip(self) -> str:
        if self.cidr is None:
            raise ConfigError(f"{self.dev} in {self.ns} has no address", key="port", value=self.dev)
        return self.cidr.split("/")[0]


class Emulation:
    """``with Emulation(3, topology="bridge", shape=Shape(rate_bps=100e6)) as emu: ...``.

    ``shape`` applies to every direction, ``shapes`` overrides single directions (keys ``(src, dst)``).
    Without netem in the kernel, delay and jitter are not applied by tc: :meth:`transport_query` returns
    what the endpoints must add with ShapedTransport. ``tag`` fixes the namespace names (for manual setups);
    by default each instance gets a unique one.
    """

    def __init__(
        self,
        sites: int,
        *,
        topology: Topology = "mesh",
        shape: Shape | None = None,
        shapes: Mapping[tuple[int, int], Shape] | None = None,
        tag: str | None = None,
        caps: Capabilities | None = None,
    ) -> None:
        if topology not in ("mesh", "bridge"):
            raise ConfigError(
                f"topology must be 'mesh' or 'bridge', not {topology!r}", key="topology", value=topology
            )
        top = MAX_MESH_SITES if topology == "mesh" else MAX_BRIDGE_SITES
        if not 2 <= sites <= top:
            raise ConfigError(f"a {topology} needs 2..{top} sites", key="sites", value=sites)
        self.sites = sites
        self.topology: Topology = topology
        self.tag = check_tag(tag) if tag is not None else auto_tag()
        self._caps = caps
        self._ports: dict[tuple[int, int], Port] = self._plan_ports()
        default = shape or Shape()
        self._shapes: dict[tuple[int, int], Shape] = {d: default for d in self._ports}
        for direction, s in (shapes or {}).items():
            self._check_direction(direction)
            self._shapes[direction] = s
        self._applied: dict[tuple[int, int], Shape] = {}
        self._created: list[str] = []

    # ----------------------------------------------------------------------------------------- naming

    def namespace(self, site: int) -> str:
        """Name of a site's namespace (``HUB`` for the bridge's)."""
        if site == HUB:
            if self.topology != "bridge":
                raise ConfigError("only a bridge topology has a hub", key="site", value=site)
            return f"{PREFIX}{self.tag}-hub"
        if not 0 <= site < self.sites:
            raise ConfigError(f"site must be in 0..{self.sites - 1}", key="site", value=site)
        return f"{PREFIX}{self.tag}-s{site}"

    @property
    def namespaces(self) -> list[str]:
        names = [self.namespace(i) for i in range(self.sites)]
        return [*names, self.namespace(HUB)] if self.topology == "bridge" else names

    def _plan_ports(self) -> dict[tuple[int, int], Port]:
        """Direction (src, dst) -> the port whose egress carries it."""
        ports: dict[tuple[int, int], Port] = {}
        if self.topology == "mesh":
            for k, (i, j) in enumerate(itertools.combinations(range(self.sites), 2)):
                ports[(i, j)] = Port(self.namespace(i), f"wan{j}", f"10.213.{k}.1/30")
                ports[(j, i)] = Port(self.namespace(j), f"wan{i}", f"10.213.{k}.2/30")
        else:
            for i in range(self.sites):
                ports[(i, HUB)] = Port(self.namespace(i), "wan0", f"10.213.0.{i + 1}/24")
                ports[(HUB, i)] = Port(self.namespace(HUB), f"s{i}", None)
        return ports

    def _check_direction(self, direction: tuple[int, int]) -> None:
        if direction not in self._ports:
            hint = "(i, j) for sites i != j" if self.topology == "mesh" else "(i, HUB) or (HUB, i)"
            raise ConfigError(
                f"no link carries direction {direction}; use {hint}", key="direction", value=direction
            )

    @property
    def directions(self) -> list[tuple[int, int]]:
        """Every shaped direction ``(src, dst)``."""
        return list(self._ports)

    def port(self, src: int, dst: int) -> Port:
        """The veth end whose egress carries ``src`` → ``dst``."""
        self._check_direction((src, dst))
        return self._ports[(src, dst)]

    def address(self, site: int, peer: int) -> str:
        """The IPv4 address of ``site`` that ``peer`` reaches it at."""
        if site == peer:
            raise ConfigError("a site and its peer must differ", key="peer", value=peer)
        if self.topology == "mesh":
            return self.port(site, peer).ip
        self.namespace(peer)  # validates peer
        return self.port(site, HUB).ip

    def exec_argv(self, site: int, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside ``site``'s namespace (processes still there at teardown are killed)."""
        return ["ip", "netns", "exec", self.namespace(site), *argv]

    # ------------------------------------------------------------------------------------------ build

    @property
    def caps(self) -> Capabilities:
        if self._caps is None:
            self._caps = probe()
        return self._caps

    def __enter__(self) -> Self:
        self.up()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.down()

    def up(self) -> None:
        """Build everything; on any failure remove what was built and re-raise."""
        reason = self.caps.skip_reason()
        if reason is not None:
            raise NetnsError(f"cannot emulate here: {reason}")
        if self._created:
            raise NetnsError("this emulation is already up")
        for s in self._shapes.values():
            kernel_part(s, netem=self.caps.netem)  # refuse what cannot be emulated before building anything
        if tagged(self.tag):
            raise NetnsError(
                f"namespaces tagged {self.tag!r} exist already (tools/netem.py down --tag {self.tag})"
            )
        try:
            self._build()
        except BaseException:
            self.down()
            raise

    def _ns_add(self, ns: str) -> None:
        run(["ip", "netns", "add", ns])
        self._created.append(ns)
        run(["ip", "-n", ns, "link", "set", "lo", "up"])

    def _build(self) -> None:
        for ns in self.namespaces:
            self._ns_add(ns)
        if self.topology == "bridge":
            hub = self.namespace(HUB)
            run(["ip", "-n", hub, "link", "add", "br0", "type", "bridge"])
            run(["ip", "-n", hub, "link", "set", "br0", "up"])
        pairs = (
            [(self.port(i, j), self.port(j, i)) for i, j in itertools.combinations(range(self.sites), 2)]
            if self.topology == "mesh"
            else [(self.port(i, HUB), self.port(HUB, i)) for i in range(self.sites)]
        )
        for a, b in pairs:
            # Both ends are created directly inside their namespaces: nothing ever appears in the host's.
            run(
                [
                    "ip",
                    "link",
                    "add",
                    a.dev,
                    "netns",
                    a.ns,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    b.dev,
                    "netns",
                    b.ns,
                ]
            )
            for p in (a, b):
                if p.cidr is not None:
                    run(["ip", "-n", p.ns, "addr", "add", p.cidr, "dev", p.dev])
                else:
                    run(["ip", "-n", p.ns, "link", "set", p.dev, "master", "br0"])
                run(["ip", "-n", p.ns, "link", "set", p.dev, "up"])
        for direction, s in self._shapes.items():
            self._apply(direction, s)

    def down(self) -> None:
        """Kill what runs inside, delete every namespace made. Idempotent; tries all before raising."""
        first: NetnsError | None = None
        for ns in reversed(self._created):
            try:
                delete_namespace(ns)
            except NetnsError as exc:
                first = first or exc
        self._created.clear()
        self._applied.clear()
        if first is not None:
            raise first

    # ---------------------------------------------------------------------------------------- shaping

    def _apply(self, direction: tuple[int, int], shape: Shape) -> None:
        port = self._ports[direction]
        new = kernel_part(shape, netem=self.caps.netem)
        old = self._applied.get(direction)
        if old is not None and layout(old) == layout(new):
            cmds = qdisc_commands(port.dev, new, verb="change")
        else:
            if old is not None and qdisc_commands(port.dev, old):
                run(["tc", "-n", port.ns, "qdisc", "del", "dev", port.dev, "root"])
            cmds = qdisc_commands(port.dev, new, verb="add")
        for args in cmds:
            run(["tc", "-n", port.ns, *args])
        self._applied[direction] = new
        self._shapes[direction] = shape

    def set_shape(self, src: int, dst: int, shape: Shape) -> None:
        """Reshape one direction now (``tc qdisc change`` when the qdisc layout stays: queued packets are
        kept and the new rate applies to them)."""
        self._check_direction((src, dst))
        if not self._created:
            raise NetnsError("set_shape() needs the emulation up")
        self._apply((src, dst), shape)

    def shape(self, src: int, dst: int) -> Shape:
        self._check_direction((src, dst))
        return self._shapes[(src, dst)]

    def _path(self, src: int, dst: int) -> list[tuple[int, int]]:
        if self.topology == "mesh":
            return [(src, dst)]
        return [(src, HUB), (HUB, dst)]

    def transport_query(self, src: int, dst: int) -> str:
        """URL query for the sender at ``src`` talking to ``dst``: the delay and jitter the kernel does not
        apply (no netem), for ShapedTransport; empty when the kernel does it all. Through a bridge the
        path's delays add; jitters add too, an upper bound of the spread."""
        if src == dst:
            raise ConfigError("a site and its peer must differ", key="dst", value=dst)
        delay = jitter = 0.0
        for d in self._path(src, dst):
            self._check_direction(d)
            want, kernel = self._shapes[d], kernel_part(self._shapes[d], netem=self.caps.netem)
            delay += want.delay_s - kernel.delay_s
            jitter += want.jitter_s - kernel.jitter_s
        return transport_query(delay, jitter)

    def bottleneck_bps(self, src: int, dst: int) -> float:
        """The smallest tbf rate on the path (inf when unshaped)."""
        return min((self._shapes[d].rate_bps for d in self._path(src, dst)), default=math.inf)

    def qdiscs(self, src: int, dst: int) -> str:
        """``tc qdisc show`` of the port carrying ``src`` → ``dst`` (for logs and tests)."""
        port = self.port(src, dst)
        return run(["tc", "-n", port.ns, "qdisc", "show", "dev", port.dev])[1]
