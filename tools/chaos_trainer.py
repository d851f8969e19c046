"""A site leader for the chaos soak: :class:`tools.harness.protocol_trainer.ProtocolTrainer` (the real trainer
protocol over a real transport, the client's parameter resync) with a clock and lean records.

What the soak adds: the loop time of every event the trainer sees (an Aggregate, a ConfigUpdate, a Notice,
a Welcome, a resync, an error), so the longest wait with no news is measured from the trainer's own clock;
a pause per iteration (``compute_s``) so a run lasts as long as the event schedule; and records that stay
small (a flag per push, a fingerprint per aggregate, the pushes' dense sum per layer), because the soak's
memory metric must measure the daemons, not this record. :meth:`ChaosTrainer.kill` drops the connection as
a crashed trainer would (no Bye); pushes the gateway has not acknowledged are sent again by
:meth:`ChaosTrainer.reconnect` (a trainer that checkpoints its unacknowledged pushes).
"""

from __future__ import annotations

import asyncio
import zlib
from array import array
from collections.abc import Callable

import numpy as np

from tools.harness.exact_payloads import layer_shape, make_payload
from tools.harness.protocol_trainer import Key, ProtocolTrainer, signature_info
from wanrt.errors import PeerLost, RemoteProtocolError, WanrtError
from wanrt.payload import SparsePayload
from wanrt.protocol import Aggregate

__all__ = ["ChaosTrainer", "layer_shape", "make_payload", "signature_info"]


class ChaosTrainer(ProtocolTrainer):
    """One site's trainer: pushes every layer of an iteration (last first), at most ``staleness`` ahead."""

    READ_ERRORS = (PeerLost, OSError, ConnectionError, RemoteProtocolError)
    PUSH_ERRORS = (WanrtError, OSError, ConnectionError, AssertionError)  # the link may be gone mid-push
    RESEND_ERRORS = (WanrtError, OSError, ConnectionError)  # still unacked: the next reconnect sends them

    def __init__(
        self,
        url: str,
        site: str,
        job: str,
        secret: bytes,
        *,
        layers: int,
        iterations: int,
        compute_s: float = 0.0,
        staleness: int = 1,
        clock: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(
            url,
            site,
            job,
            secret,
            layers=layers,
            iterations=iterations,
            staleness=staleness,
            compute_s=compute_s,
        )
        # what was pushed, compactly: a flag per (layer, iteration) and the dense sum per layer; payloads are
        # recomputed on demand
        self.pushed_flags = [bytearray() for _ in range(layers)]
        self.pushed_sum = [np.zeros(layer_shape(layer)[0], np.float32) for layer in range(layers)]
        self.pushes = 0
        # per layer and iteration: a fingerprint (crc of ids and values, -1: none yet) of the aggregate;
        # the payloads go into ``params`` and are dropped
        self.fingerprints = [np.full(0, -1, np.int64) for _ in range(layers)]
        self.mismatched_duplicates = 0
        # when the trainer heard anything (loop time): what the silent-wait metric reads. 8 bytes an event in
        # an array, not a (time, kind) tuple in a list (~90 bytes): a full soak's 70 000 aggregates made
        # ~6 MB of this record count as the daemons' RSS growth
        self.event_times = array("d")
        self.resync_times: list[float] = []  # when a parameter snapshot was swapped in
        self._clock = clock or (lambda: asyncio.get_running_loop().time())

    def _event(self, kind: str) -> None:
        now = self._clock()
        self.event_times.append(now)
        if kind == "resync":
            self.resync_times.append(now)
        self._progress.set()

    def has_aggregate(self, iteration: int, layer: int) -> bool:
        return self.fingerprint(iteration, layer) >= 0

    def _record_aggregate(self, key: Key, event: Aggregate) -> bool:
        if not 0 <= event.layer < self.layers:
            return False
        seen = self.fingerprint(*key)
        fingerprint = _crc(event)
        if seen >= 0:
            self.duplicates += 1
            self.mismatched_duplicates += seen != fingerprint
            return False
        self._set_fingerprint(key, fingerprint)
        return True

    def _payload(self, iteration: int, layer: int) -> SparsePayload:
        return make_payload(self.site, iteration, layer)

    def _record_push(self, key: Key, payload: SparsePayload) -> None:
        n, layer = key
        flags = self.pushed_flags[layer]
        if n >= len(flags):
            flags.extend(bytes(n + 1 - len(flags) + 256))
        if not flags[n]:
            flags[n] = 1
            payload.add_into(self.pushed_sum[layer])
            self.pushes += 1

    def fingerprint(self, iteration: int, layer: int) -> int:
        fp = self.fingerprints[layer]
        return int(fp[iteration]) if 0 <= iteration < len(fp) else -1

    def _set_fingerprint(self, key: Key, value: int) -> None:
        it, layer = key
        fp = self.fingerprints[layer]
        if it >= len(fp):
            grown = np.full(it + 1024, -1, np.int64)  # linear steps: a doubled array's -1 tail is RSS too
            grown[: len(fp)] = fp
            self.fingerprints[layer] = fp = grown
        fp[it] = value

    def pushed_iterations(self, layer: int) -> np.ndarray:
        return np.flatnonzero(np.frombuffer(bytes(self.pushed_flags[layer]), np.uint8))

    def parameters(self) -> list[np.ndarray]:
        """The trainer's parameter vector: every aggregate it applied, summed per layer (exact in fp32)."""
        return self.params


def _crc(a: Aggregate) -> int:
    ids = ",".join(a.sites).encode()
    return zlib.crc32(ids + b"|" + a.payload.values_f32().tobytes())
