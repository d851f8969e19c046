"""A push made while the link reconnects reaches the gateway once, whatever the interleaving.

The training thread's ``push`` used to note the push for re-sending (``_unacked``, loop thread, by one
``call_soon_threadsafe``) and queue its frames for the writer (by another). A reconnect that ran between the
two re-sent it from the noted pushes, and the writer then sent the queued copy too: the gateway got the
push twice (its ledger must then not fold it twice: tests/gateways/test_gateway_policies.py). Now the note
rides in the same outbox batch as the frames, moved on the loop thread in one step. The test forces that
interleaving: the push stops between the two (in ``cut_push``, which runs there) until the reconnect is
done, with the gateway's connection dropped meanwhile.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np
import pytest

from tools.harness.fake_gateway import FakeGateway, run_in_thread
from wanrt.client.config import ClientConfig
from wanrt.client.link import gateway_link
from wanrt.client.link.api import LinkSpec
from wanrt.client.link.gateway_link import open_gateway_link
from wanrt.client.link.reconnect import ReconnectPolicy
from wanrt.client.link.signature import LayerSignature
from wanrt.payload import SparsePayload
from wanrt.protocol import Push
from wanrt.protocol.push_pieces import PUSH_CUT_KEY, push_cut_value

SECRET = b"0123456789abcdef-test-secret"
SIG = LayerSignature.of(["w"], [(64,)], ["float32"])


class RecordingGateway(FakeGateway):
    """Records every Push it reads (and answers none: nothing is acknowledged, so every push is re-sent on
    a reconnect); offers a push cut, so the link calls ``cut_push`` on every push."""

    def __init__(self, url: str) -> None:
        super().__init__(url, sites=("a",), job="j", secret=SECRET)
        self.welcome_info[PUSH_CUT_KEY] = push_cut_value(2, 1 << 20)
        self.seen: list[tuple[int, int]] = []

    async def _on_push(self, site: str, msg: Push) -> None:
        self.seen.append((msg.iteration, msg.layer))

    async def drop(self, site: str) -> None:
        """The connection ends (a gateway restart, as the trainer sees it); the listener stays."""
        _, transport = self._conns.pop(site)
        await transport.close()


def _payload(scale: float) -> SparsePayload:
    dense = np.arange(64, dtype=np.float32) * np.float32(scale)
    return SparsePayload.from_dense_blocks(0, dense, np.array([0, 2], dtype=np.int64), 16)


@pytest.mark.timeout(60)
def test_a_push_during_a_reconnect_is_sent_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gw = RecordingGateway(f"unix://{tmp_path}/gw.sock")
    cfg = ClientConfig(connect_timeout_s=5.0, close_timeout_s=5.0)
    spec = LinkSpec(gw.url, "a", "j", SECRET, SIG, cfg, reconnect=ReconnectPolicy(initial_s=0.05, max_s=0.2))
    real_cut = gateway_link.cut_push
    armed, inside, reconnected = threading.Event(), threading.Event(), threading.Event()

    def cut_push(*args: object) -> object:
        if armed.is_set():  # the second push: stop here until the link has reconnected
            inside.set()
            assert reconnected.wait(20), "the link did not reconnect"
        return real_cut(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(gateway_link, "cut_push", cut_push)
    with run_in_thread(gw) as gw_loop:
        link = open_gateway_link(spec)
        start_tasks = link._start_tasks

        def started() -> None:  # the reconnect's last step: everything unacknowledged was re-sent
            start_tasks()
            reconnected.set()

        monkeypatch.setattr(link, "_start_tasks", started)
        try:
            link.push(0, 0, _payload(1.0))
            armed.set()
            pusher = threading.Thread(target=link.push, args=(1, 0, _payload(2.0)))
            pusher.start()
            assert inside.wait(10)
            # whatever the push scheduled on the link's loop before it stopped has run
            asyncio.run_coroutine_threadsafe(asyncio.sleep(0), link._loop).result(5)
            asyncio.run_coroutine_threadsafe(gw.drop("a"), gw_loop).result(5)
            pusher.join(20)
            assert not pusher.is_alive()
        finally:
            link.close(5.0)  # flushes what is queued, then Bye: the gateway read every push before it
    assert all("closed transport" in e for e in gw.errors), gw.errors  # only the dropped connection's read
    assert link.reconnects == 1
    assert gw.seen.count((1, 0)) == 1, gw.seen
    assert gw.seen.count((0, 0)) == 2, gw.seen  # never acknowledged: sent, then re-sent once
