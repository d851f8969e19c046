"""Reliability item 11: what an authenticated link made a gateway allocate is given back when the link
closes — a peer that announces the largest chunked frame and reconnects, again and again, does not grow
the gateway's memory."""

from __future__ import annotations

import gc

import pytest

from gateways.rounds.config import RoundConfig
from tests.gateways.service.daemon_fakes import FakePeer
from tools.harness.daemon_cluster import JOB, SECRET, running, short_dir, site_configs
from wanrt.protocol import Chunk
from wanrt.protocol.limits import MAX_FRAME_BYTES

ROUNDS = RoundConfig(topology="star", round_deadline_s=20.0, suspect_after_s=20.0)
MIB = 1 << 20


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        pages = int(fh.read().split()[1])
    import resource

    return pages * resource.getpagesize() / MIB


def _reserved(daemon: object) -> int:
    """Bytes the gateway reserved for site a's partly received chunked frames."""
    ch = daemon.node.mesh.by_peer.get("a")  # type: ignore[attr-defined]
    reasm = None if ch is None else ch.conn._reassembler
    return 0 if reasm is None else int(reasm.reserved_bytes)


@pytest.fixture(autouse=True)
def _numpy_codec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANRT_KERNELS", "numpy")


@pytest.mark.timeout(90)
async def test_reassembly_buffers_of_a_closed_link_are_freed() -> None:
    with short_dir() as tmp:
        configs = site_configs(tmp, "ab", rounds=ROUNDS)
        configs = {"b": configs["b"]}  # b alone; the test's fake peer is site a
        async with running(configs) as cluster:
            b = cluster.daemons["b"]
            peer = FakePeer("a", JOB, SECRET.encode(), ROUNDS)
            growth = []
            for _ in range(6):
                gc.collect()
                before = _rss_mb()
                conn, transport = await peer.handshake(configs["b"].listen)
                await b.wait_for(lambda: b.status()["peers"]["a"]["state"] == "up")
                # one chunk of a frame announced at the largest size: the receiver reserves its buffer
                first = Chunk(1, 0, MAX_FRAME_BYTES, bytes(64 * 1024))
                await transport.send(conn.send_parts(first))
                await b.wait_for(lambda: _reserved(b) == MAX_FRAME_BYTES)
                await transport.close()
                await b.wait_for(lambda: b.status()["peers"]["a"]["state"] != "up" and not b._links)
                gc.collect()
                growth.append(round(_rss_mb() - before, 1))
            total = sum(growth)
            assert total < 64, f"RSS grew {total:.0f} MiB over 6 reconnects (per attempt: {growth})"
            await cluster.stop_all()


@pytest.mark.timeout(60)
async def test_rounds_a_lost_peer_opened_for_bogus_layers_are_freed() -> None:
    """An authenticated child opened rounds for 2 000 layers this site's trainer never pushes; once it is
    lost they hold nothing and are freed (they stayed allocated until the job ended)."""
    import dataclasses

    from wanrt.protocol.peer.round_frames import RoundTag

    with short_dir() as tmp:
        configs = {"b": dataclasses.replace(site_configs(tmp, "ab", rounds=ROUNDS)["b"], root="b")}
        async with running(configs) as cluster:
            b = cluster.daemons["b"]
            conn, transport = await FakePeer("a", JOB, SECRET.encode(), ROUNDS).handshake(configs["b"].listen)
            await b.wait_for(lambda: b.engine is not None)
            plan = b.engine._timeline.plan_for(0)
            assert plan.parent_of("a") == "b"  # the fake peer is a child: it may send partials
            for layer in range(2000):
                tag = RoundTag(layer, "partial", 0, layer, plan.plan_id, 0, -1, (("a", 0),), False)
                await transport.send(conn.send_parts(tag))
            await b.wait_for(lambda: len(b.engine._rounds) == 2000)
            await transport.close()
            await b.wait_for(lambda: b.status()["peers"]["a"]["state"] == "lost")
            assert len(b.engine._rounds) == 0
            await cluster.stop_all()
