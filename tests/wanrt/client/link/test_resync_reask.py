"""A snapshot that fails its checksum is asked for again through the real link, and the good one installed.

The reader hands its resync questions to the writer (``GatewayLink._send_soon``) instead of writing them
itself (the deadlock regression in test_reader_never_blocks.py). The first question follows a gateway's
``resync`` notice, the second a snapshot whose checksum does not match what arrived; this checks both reach
the gateway over a real socket, in order, and that only the snapshot that passes its checksum is swapped in
(the receiver's own logic is tested alone in test_snapshot_receiver.py; this is the wiring).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch

import wanrt
from tools.harness.fake_gateway import FakeGateway, run_in_thread
from transports import Transport
from wanrt.client import ClientConfig, SparseOptimizer
from wanrt.client.link.param_resync import snapshot_frames
from wanrt.protocol import Message, Notice, ParamRequest
from wanrt.protocol.connection import Connection
from wanrt.protocol.events import ConnectionClosed

SECRET = b"0123456789abcdef-test-secret"
#: the iteration the resync is asked at: the snapshot holds every result below it
RESYNC_AT = 1


class ResyncGateway(FakeGateway):
    """The fake gateway serving one snapshot: corrupt the first time it is asked (the announce carries the
    checksum of other values than the chunks hold), intact the second time."""

    def __init__(self, url: str, good: list[np.ndarray]) -> None:
        super().__init__(url, sites=("a",), job="j", secret=SECRET)
        self.good = good
        self.requests: list[ParamRequest] = []

    async def _next(self, conn: Connection, transport: Transport) -> Message | ConnectionClosed:
        while True:
            event = await super()._next(conn, transport)
            if not isinstance(event, ParamRequest):
                return event
            self.requests.append(event)
            await self._answer(conn, transport, event)

    async def _answer(self, conn: Connection, transport: Transport, req: ParamRequest) -> None:
        frames = list(snapshot_frames(req.request, RESYNC_AT, (), self.good))
        if len(self.requests) == 1:
            wrong = [a + 1.0 for a in self.good]
            frames[0] = next(iter(snapshot_frames(req.request, RESYNC_AT, (), wrong)))  # its announce
        for frame in frames:
            await transport.send(conn.send_parts(frame))

    async def notice_resync(self) -> None:
        for conn, transport in list(self._conns.values()):
            notice = Notice("b", "resync", "a peer asks this site to resync", False, {"iteration": RESYNC_AT})
            await transport.send(conn.send_parts(notice))


@pytest.mark.timeout(60)
def test_a_corrupt_snapshot_is_asked_for_again_and_only_the_good_one_installed(
    tmp_path: Path, single_rank_group: None
) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    x = torch.randn(16, 8)
    good = [np.full(p.numel(), 0.25 * (i + 1), np.float32) for i, p in enumerate(model.parameters())]
    gw = ResyncGateway(f"unix://{tmp_path}/gw.sock", good)
    cfg = ClientConfig.dense_baseline(
        staleness=0, reconnect_s=0.0, update_deadline_s=20.0, close_timeout_s=5.0
    )
    with run_in_thread(gw) as loop:
        ctx = wanrt.init(gw.url, site="a", job="j", secret=SECRET, config=cfg)
        opt = SparseOptimizer(
            model.named_parameters(), "sgd", lr=0.0, ctx=ctx
        )  # lr 0: only the snapshot moves
        try:
            model(x).square().mean().backward()
            opt.step()  # iteration 0, answered by the gateway (one site: its own push)
            opt.zero_grad()
            asyncio.run_coroutine_threadsafe(gw.notice_resync(), loop).result(10)
            for _ in range(3):  # the held iterations; the snapshot is installed on one of these steps
                model(x).square().mean().backward()
                opt.step()
                opt.zero_grad()
                if ctx.resyncs:
                    break
            resyncs = ctx.resyncs
        finally:
            ctx.close()
    assert gw.errors == []
    assert [r.request for r in gw.requests] == [1, 2]  # the question, then the same question once more
    assert all(r.iteration == RESYNC_AT for r in gw.requests)
    assert resyncs == 1
    for p, want in zip(model.parameters(), good, strict=True):
        np.testing.assert_array_equal(p.detach().numpy().reshape(-1), want)
