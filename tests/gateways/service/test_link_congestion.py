"""Two real gateways over loopback TCP: both ends of their link run the congestion control the config names
(``[gateway] tcp_congestion``), not the host's default; a name the kernel lacks leaves the link up."""

from __future__ import annotations

import dataclasses
import socket
from typing import Any

import pytest

from gateways.service.daemon import GatewayDaemon
from tests.transports.test_tcp_tuning import kernel_congestion_controls
from tools.harness.daemon_cluster import running, short_dir, site_configs

pytestmark = pytest.mark.skipif(not hasattr(socket, "TCP_CONGESTION"), reason="no TCP_CONGESTION here")


def _link_ccs(d: GatewayDaemon) -> list[str]:
    out = []
    for link in d._links.values():
        sock: Any = link.transport.get_extra_info("socket")  # type: ignore[attr-defined]
        raw = bytes(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16))
        out.append(raw.split(b"\0")[0].decode())
    return out


async def _linked_pair(tcp_congestion: str) -> tuple[list[str], list[str]]:
    with short_dir() as tmp:
        base = site_configs(tmp, "ab")
        # b (the larger name) only accepts; a dials it once b's real port is known
        b = dataclasses.replace(base["b"], listen="tcp://127.0.0.1:0", tcp_congestion=tcp_congestion)
        b = dataclasses.replace(b, peers={"a": "tcp://127.0.0.1:9"})
        async with running({"b": b}) as cb:
            url = cb.daemons["b"].ready_info()["listen"]
            a = dataclasses.replace(base["a"], peers={"b": url}, tcp_congestion=tcp_congestion)
            async with running({"a": a}) as ca:
                da, db = ca.daemons["a"], cb.daemons["b"]
                await da.wait_for(lambda: da.status()["peers"]["b"]["state"] == "up" and bool(da._links))
                await db.wait_for(lambda: db.status()["peers"]["a"]["state"] == "up" and bool(db._links))
                return _link_ccs(da), _link_ccs(db)


@pytest.mark.timeout(60)
async def test_both_ends_of_a_link_run_the_configured_congestion_control() -> None:
    allowed = kernel_congestion_controls("allowed")
    if "reno" not in allowed:
        pytest.skip("reno is not an allowed congestion control here")
    assert await _linked_pair("reno") == (["reno"], ["reno"])  # neither the default (cubic) nor the host's


@pytest.mark.timeout(60)
async def test_a_congestion_control_the_kernel_lacks_leaves_the_link_up() -> None:
    a, b = await _linked_pair("nosuchcc")
    assert len(a) == 1 and len(b) == 1 and "nosuchcc" not in a + b
