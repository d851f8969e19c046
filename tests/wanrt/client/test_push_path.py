"""The leader's push path after the overhead cuts: the same bits as before, fewer copies and wake-ups."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.wanrt.client.test_context_local import coeffs, make
from wanrt.client import ClientConfig
from wanrt.client.leader.push_path import LeaderPush
from wanrt.client.link.gateway_link import GatewayLink
from wanrt.client.site.decision import ConfigChange
from wanrt.client.site.settings_in_force import SettingsInForce


def _bare_push(batch_weight: float, world_size: int) -> LeaderPush:
    settings = SettingsInForce(ClientConfig())  # local_steps = 1: the site mean divides by the ranks only
    settings.batch_weight = batch_weight
    return LeaderPush(settings, world_size, None, None, lambda: False)  # only what site_mean reads


def test_a_scale_of_one_compresses_the_gradient_itself_without_a_copy() -> None:
    flat = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    before = flat.copy()
    out = _bare_push(1.0, 1).site_mean(0, flat)
    assert out is flat
    assert np.array_equal(out.view(np.uint32), before.view(np.uint32))


@pytest.mark.parametrize(("weight", "world"), [(1.0, 2), (0.5, 1), (0.37, 3)])
def test_another_scale_gives_the_old_products_bit_for_bit_in_a_reused_buffer(
    weight: float, world: int
) -> None:
    push = _bare_push(weight, world)
    rng = np.random.default_rng(1)
    first = None
    for _ in range(3):
        flat = rng.standard_normal(4099).astype(np.float32)
        flat[:3] = (-0.0, np.float32(1e-45), np.float32(3e38))  # signed zero, a subnormal, near overflow
        out = push.site_mean(7, flat)
        want = flat * np.float32(weight / world)  # what the client computed before the cut
        assert out.dtype == np.float32
        assert np.array_equal(out.view(np.uint32), want.view(np.uint32))
        first = out if first is None else first
        assert out is first  # one buffer per layer, not an allocation per step


def test_a_layer_that_changes_length_gets_a_new_buffer() -> None:
    push = _bare_push(0.5, 1)
    a = push.site_mean(0, np.ones(10, dtype=np.float32))
    b = push.site_mean(0, np.ones(12, dtype=np.float32))
    assert a.shape == (10,) and b.shape == (12,) and np.all(b == 0.5)


@pytest.mark.usefixtures("single_rank_group")
def test_pushes_carry_the_scaled_gradient_after_a_weight_change_and_leave_the_grads_alone(
    secret_file: Path,
) -> None:
    model, opt, link = make(secret_file, {}, ClientConfig.dense_baseline(staleness=0, update_deadline_s=5.0))
    link.announce(ConfigChange(effective_iteration=1, batch_weight=0.25))
    grads = []
    for t in range(3):
        model.loss(*coeffs(t)).backward()
        grads.append([p.grad.clone() for p in (model.a, model.b)])  # type: ignore[union-attr]
        opt.step()
        assert model.a.grad is not None
        assert torch.equal(model.a.grad, grads[-1][0])  # the push path never writes the user's gradient
        opt.zero_grad()
    pushed = {(it, layer): p for it, layer, p in link.pushed}
    for t in range(3):
        scale = np.float32(0.25 if t >= 1 else 1.0)
        for layer in (0, 1):
            want = grads[t][layer].numpy() * scale
            got = pushed[(t, layer)].to_dense()
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    opt.ctx.close()


class _Loop:
    """Stands in for the link thread's event loop: records the wake-ups instead of running them."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def call_soon_threadsafe(self, fn: Any, *args: Any) -> None:
        self.calls.append((fn, args))


class _Queue:
    def __init__(self) -> None:
        self.items: list[Any] = []

    def put_nowait(self, item: Any) -> None:
        self.items.append(item)


def _bare_link() -> tuple[GatewayLink, _Loop, _Queue]:
    link = GatewayLink.__new__(GatewayLink)
    loop, queue = _Loop(), _Queue()
    link._loop = loop  # type: ignore[assignment]
    link._pushes = queue  # type: ignore[assignment]
    link._outbox = []
    link._outbox_lock = threading.Lock()
    link._wake_pending = False
    return link, loop, queue


def test_messages_queued_while_a_wake_up_is_pending_ride_along_in_order() -> None:
    link, loop, queue = _bare_link()
    msgs: list[Any] = [object() for _ in range(5)]
    link._enqueue(msgs[0])
    link._enqueue(msgs[1], msgs[2])
    assert len(loop.calls) == 1  # one wake-up for the three
    fn, args = loop.calls.pop()
    fn(*args)
    assert queue.items == msgs[:3]
    link._enqueue(msgs[3])  # the wake-up ran: the next message needs a new one
    link._enqueue(msgs[4])
    assert len(loop.calls) == 1
    fn, args = loop.calls.pop()
    fn(*args)
    assert queue.items == msgs


@pytest.mark.usefixtures("single_rank_group")
def test_a_site_of_one_rank_broadcasts_no_decision(secret_file: Path) -> None:
    model, opt, link = make(secret_file, {}, ClientConfig(density=0.25, staleness=1, update_deadline_s=5.0))

    def refuse(*_: object) -> None:
        raise AssertionError("a one-rank site broadcast its decision")

    opt.ctx._channel.send = refuse  # type: ignore[method-assign]
    before = model.a.detach().clone()
    for t in range(3):
        model.loss(*coeffs(t)).backward()
        opt.step()
        opt.zero_grad()
    opt.ctx.close()
    assert len(link.pushed) == 6
    assert not torch.equal(before, model.a.detach())  # the updates were applied all the same


class _Conn:
    def send_parts(self, msg: bytes) -> list[memoryview]:
        return [memoryview(msg[:1]), memoryview(msg[1:])]  # a header and a body, like a framed message


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    async def send(self, parts: list[memoryview]) -> None:
        self.writes.append(b"".join(parts))


def test_the_writer_joins_what_is_queued_into_few_writes_in_order_and_bounded() -> None:
    import asyncio

    from wanrt.client.link.gateway_link import WRITE_BATCH_BYTES

    big = b"B" * (WRITE_BATCH_BYTES + 10)
    msgs = [b"a1", b"b22", b"c333", big, b"d4", b"e55"]

    async def main() -> _Transport:
        link = GatewayLink.__new__(GatewayLink)
        link._pushes = asyncio.Queue()
        link._conn = _Conn()  # type: ignore[assignment]
        transport = _Transport()
        link._transport = transport  # type: ignore[assignment]
        link._error = None
        for m in msgs:
            link._pushes.put_nowait(m)  # type: ignore[arg-type]
        task = asyncio.create_task(link._writer())
        await asyncio.wait_for(link._pushes.join(), 5)  # every message acknowledged as written
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return transport

    transport = asyncio.run(main())
    assert b"".join(transport.writes) == b"".join(msgs)  # same bytes, same order
    # the small ones before the big one share a write; the big one ends its batch; the rest share one
    assert transport.writes == [b"a1b22c333" + big, b"d4e55"]
