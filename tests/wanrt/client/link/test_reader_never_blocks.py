"""The link's reader keeps reading while its writer is stuck in a big push (regression test for 2cd99df).

The deadlock it guards against: the reader used to write the Ack of every Aggregate itself. While the writer
was mid-way through a multi-MB push into a gateway that was not reading, that Ack's drain blocked and the
reader stopped reading; a gateway that writes a big result before it reads on (tools/harness/fake_gateway.py
does) then blocked in its write too, and neither side read again (``tools/bench_client.py --quick`` hung in
one run of three). Here a gateway makes that interleaving happen every time instead of one time in three:
it reads until the trainer's big push is on the wire, stops reading, and writes a 4 MB result. Its write
completes only if the client's reader keeps reading; a reader stuck behind its writer fails the test within
``WRITE_LIMIT_S`` (the gateway then drops the connection), never hangs it.
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
from wanrt.errors import WanrtError
from wanrt.payload import SparsePayload
from wanrt.protocol.connection import Connection
from wanrt.protocol.events import NEED_DATA, ConnectionClosed
from wanrt.protocol.messages import Ack, Aggregate, Message, Push

SECRET = b"0123456789abcdef-test-secret"
WIDTH = 1024
BIG_LAYER = 0  # Linear(WIDTH, WIDTH) without bias: 1 M fp32 elements, a 4 MB push and a 4 MB result
SMALL_LAYERS = (1, 2)  # Linear(WIDTH, 4): its weight and bias, pushed first (backward runs last layer first)
#: how far into the big push the gateway reads before it stops: the push is on the wire, most of it is not
READ_INTO_BIG = 64 * 1024
#: while it counts those bytes it reads in chunks this small, so it stops near READ_INTO_BIG
CHUNK = 16 * 1024
#: the big result must be written by then; a client that reads on takes milliseconds
WRITE_LIMIT_S = 10.0
LR = 0.1


class StallingGateway(FakeGateway):
    """The fake gateway with the interleaving that deadlocked made certain: once every small layer of
    iteration 0 is in and ``READ_INTO_BIG`` bytes of the big push after them, it stops reading and writes
    the small layers' results (their exact sum: this one site's push) and then the big layer's (zeros),
    the big write bounded by ``WRITE_LIMIT_S``; then it reads on. The trainer noted the big push before
    its frames, so it takes the big result as that push's answer although the push is still arriving."""

    def __init__(self, url: str) -> None:
        super().__init__(url, sites=("a",), job="j", secret=SECRET)
        self.small: dict[int, SparsePayload] = {}
        self.read_past_small: int | None = None  # counting: bytes read since the small pushes were in
        self.answered_early = False
        self.big_write_s: float | None = None  # how long the big result took to write, once written
        self.pushed: list[tuple[int, int]] = []  # (iteration, layer), in the order they were read
        self.acked: list[tuple[int, int]] = []
        self.pushed_when_answered: list[tuple[int, int]] = []

    async def _next(self, conn: Connection, transport: Transport) -> Message | ConnectionClosed:
        while True:
            event = conn.next_event()
            if isinstance(event, Ack):
                self.acked.append((event.iteration, event.layer))
            if event is not NEED_DATA:
                return event
            if self.read_past_small is not None and self.read_past_small >= READ_INTO_BIG:
                self.read_past_small = None
                if not await self._answer_without_reading(conn, transport):
                    return ConnectionClosed(False, "the big result could not be written")
            data = await transport.recv(CHUNK if self.read_past_small is not None else 1 << 20)
            if self.read_past_small is not None:
                self.read_past_small += len(data)
            conn.receive_data(data)

    async def _answer_without_reading(self, conn: Connection, transport: Transport) -> bool:
        """The results, written while this gateway reads nothing: True once all are written."""
        bs = self.small[SMALL_LAYERS[0]].block_size
        zeros = np.zeros(WIDTH * WIDTH, dtype=np.float32)
        big = SparsePayload.from_dense_blocks(BIG_LAYER, zeros, np.arange(zeros.size // bs), bs)
        results = [self.small[layer] for layer in SMALL_LAYERS] + [big]
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        try:
            async with asyncio.timeout(WRITE_LIMIT_S):
                for payload in results:
                    agg = Aggregate(self.job, 0, payload.layer, 0, "fakegw", payload, self.sites)
                    await transport.send(conn.send_parts(agg))
        except TimeoutError:
            await transport.close()  # the send left half a frame: the trainer sees the connection lost
            return False
        self.big_write_s = loop.time() - t0
        self.answered_early = True
        self.pushed_when_answered = list(self.pushed)
        return True

    async def _on_push(self, site: str, msg: Push) -> None:
        self.pushed.append((msg.iteration, msg.layer))
        if msg.iteration > 0:
            await super()._on_push(site, msg)
        elif msg.layer in SMALL_LAYERS:
            self.small[msg.layer] = msg.payload
            if len(self.small) == len(SMALL_LAYERS):
                self.read_past_small = 0
        elif not self.answered_early:  # the order this test relies on did not hold
            self.errors.append(f"layer {msg.layer} was pushed before layers {SMALL_LAYERS}: {self.pushed}")
            await super()._on_push(site, msg)


@pytest.mark.timeout(60)
def test_a_big_result_is_read_while_the_writer_is_stuck_in_a_big_push(
    tmp_path: Path, single_rank_group: None
) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH, bias=False), torch.nn.Linear(WIDTH, 4))
    x = torch.randn(8, WIDTH)
    before = [p.detach().clone() for p in model.parameters()]
    gw = StallingGateway(f"unix://{tmp_path}/gw.sock")
    # no reconnect: a connection the gateway dropped fails the step at once instead of being dialled again
    cfg = ClientConfig.dense_baseline(reconnect_s=0.0, update_deadline_s=30.0, close_timeout_s=5.0)
    failure: WanrtError | None = None
    with run_in_thread(gw):
        ctx = wanrt.init(gw.url, site="a", job="j", secret=SECRET, config=cfg)
        opt = SparseOptimizer(model.named_parameters(), "sgd", lr=LR, ctx=ctx)
        try:
            model(x).square().mean().backward()
            grads = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
            opt.step()
        except WanrtError as exc:
            failure = exc
        finally:
            ctx.close()
    assert gw.big_write_s is not None, (
        f"the gateway could not write its {WIDTH * WIDTH * 4 >> 20} MB result within {WRITE_LIMIT_S} s "
        "while the trainer's writer was stuck in its own big push: the trainer's reader stopped reading "
        f"(the step then failed with {failure!r})"
    )
    assert failure is None
    assert (0, BIG_LAYER) not in gw.pushed_when_answered  # the results went out while the push arrived
    assert gw.errors == []
    assert sorted(gw.pushed) == [(0, 0), (0, 1), (0, 2)] and gw.pushed[-1] == (0, BIG_LAYER)
    assert sorted(gw.acked) == [(0, 0), (0, 1), (0, 2)]  # the Acks the reader handed over went out
    # the results were applied: the big layer got zeros, the small ones this site's own gradient
    after = list(model.parameters())
    torch.testing.assert_close(after[0].detach(), before[0], rtol=0, atol=0)
    for i in (1, 2):
        torch.testing.assert_close(after[i].detach(), before[i] - LR * grads[i])
