"""The parameters of a test or soak trainer — the exact sum of every result it applied — with resync.

The chaos soak's trainer (tools/chaos_trainer.py) and the daemon tests' trainer share this so that both
run the client's resync mechanism (:mod:`wanrt.client.link.param_resync`) the same way: on a ``resync``
notice ask for the job's parameters and hold the results received meanwhile; swap the snapshot in and apply
the held results it lacks; answer a peer's question once every result below its iteration is applied.
Sums of :mod:`tools.harness.exact_payloads` payloads are exact in fp32, so "identical parameters" is an exact
test.
Sans-IO: messages in, messages to send out.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tools.harness.exact_payloads import layer_shape
from wanrt.client.link.param_resync import Snapshot, SnapshotReceiver, snapshot_frames, snapshot_point
from wanrt.payload import SparsePayload
from wanrt.protocol import Message, Notice, ParamAnnounce, ParamChunk, ParamRefuse, ParamRequest

__all__ = ["ExactParams"]

Key = tuple[int, int]
Seen = Callable[[int, int], bool]


class ExactParams:
    """One trainer's parameters (``params``: a dense fp32 vector per layer) and its resync state."""

    def __init__(self, layers: int, *, peer: str = "gateway") -> None:
        self.layers = layers
        self.lengths = tuple(layer_shape(layer)[0] for layer in range(layers))
        self.params = [np.zeros(n, np.float32) for n in self.lengths]
        self.receiver = SnapshotReceiver(self.lengths, peer=peer)
        self.held: dict[Key, SparsePayload] = {}
        self.snapshot: Snapshot | None = None
        self.resyncs = 0  # snapshots swapped in
        self.served = 0  # snapshots sent for peers
        self._serve: list[tuple[int, int]] = []  # (request id, iteration) asked by the gateway
        self._low = 0  # the first iteration whose results are not all in params
        self._high = 0  # one past the highest iteration with a result

    def take(self, key: Key, payload: SparsePayload) -> None:
        """A result seen for the first time: held while a snapshot is on its way, skipped if the last
        snapshot holds it, applied otherwise."""
        it, layer = key
        if not 0 <= layer < self.layers or payload.dense_len != self.lengths[layer]:
            return  # a test trainer with payloads of other shapes: its parameters are not tracked
        self._high = max(self._high, it + 1)
        if self.receiver.holding:
            self.held[key] = payload
        elif self.snapshot is None or self.snapshot.wants(it, layer):
            payload.add_into(self.params[layer])

    def connected(self) -> list[Message]:
        """A new trainer connection: the gateway dropped the questions of the old one; a snapshot still
        owed is asked for again (send these)."""
        self._serve.clear()
        request = self.receiver.ask_again()
        return [] if request is None else [request]

    def on_notice(self, notice: Notice) -> list[Message]:
        request = self.receiver.on_notice(notice)
        return [] if request is None else [request]

    def on_params(self, msg: Message, seen: Seen, floor: int) -> tuple[list[Message], bool]:
        """A resync message from the gateway: what to send, and whether a snapshot was just swapped in."""
        if isinstance(msg, ParamRequest):  # asked on behalf of a peer site
            if self.receiver.holding:
                return [ParamRefuse(msg.request, "this site's trainer is resyncing itself")], False
            self._serve.append((msg.request, msg.iteration))
            return self.serve(seen, floor), False
        if isinstance(msg, ParamAnnounce):
            self.receiver.on_announce(msg)
        elif isinstance(msg, ParamChunk):
            snap = self.receiver.on_chunk(msg)
            if snap is not None:
                self._swap(snap)
                return [], True
            if self.receiver.reask:  # failed its checksum: asked again
                request = self.receiver.ask_again()
                return ([] if request is None else [request]), False
        elif isinstance(msg, ParamRefuse) and self.receiver.on_refuse(msg):
            self._release()  # nobody will answer: stop holding
        return [], False

    def _swap(self, snap: Snapshot) -> None:
        self.params = snap.layers
        self.snapshot = snap
        self._release()
        self.resyncs += 1

    def _release(self) -> None:
        for (it, layer), payload in sorted(self.held.items()):
            if self.snapshot is None or self.snapshot.wants(it, layer):
                payload.add_into(self.params[layer])
        self.held.clear()

    def serve(self, seen: Seen, floor: int) -> list[Message]:
        """Answers to the questions that can be answered now (every result below their iteration in).

        ``seen(it, layer)``: a result was taken; ``floor``: the results below it never came here (the
        trainer joined later) and are in ``params`` through a snapshot, or were never missed."""
        if not self._serve:
            return []
        floor = max(floor, 0 if self.snapshot is None else self.snapshot.iteration)
        self._low = max(self._low, floor)
        while all(seen(self._low, layer) for layer in range(self.layers)):
            self._low += 1
        out: list[Message] = []
        waiting = []
        for request, iteration in self._serve:
            point = snapshot_point(iteration, self._low, seen, self._high, self.layers)
            if point is None:
                waiting.append((request, iteration))
                continue
            out.extend(snapshot_frames(request, point[0], point[1], self.params))
            self.served += 1
        self._serve = waiting
        return out
