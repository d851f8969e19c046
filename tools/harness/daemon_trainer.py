"""A site leader for the daemon tests: :class:`tools.harness.protocol_trainer.ProtocolTrainer` (the real
protocol as
role ``trainer`` over a real transport) that keeps everything it pushed and received for the checks, and
asserts that an aggregate received twice is the same aggregate.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tools.harness.exact_payloads import make_payload
from tools.harness.protocol_trainer import Key, ProtocolTrainer, signature_info
from wanrt.payload import SparsePayload
from wanrt.protocol import Aggregate

__all__ = ["FakeTrainer", "PayloadFn", "signature_info"]

PayloadFn = Callable[[str, int, int], SparsePayload]


class FakeTrainer(ProtocolTrainer):
    def __init__(
        self,
        url: str,
        site: str,
        job: str,
        secret: bytes,
        *,
        layers: int,
        iterations: int,
        staleness: int = 1,
        payload: PayloadFn = make_payload,
        info: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(
            url, site, job, secret, layers=layers, iterations=iterations, staleness=staleness, info=info
        )
        self.payload = payload
        self.pushed: dict[Key, SparsePayload] = {}
        self.aggregates: dict[Key, Aggregate] = {}

    def has_aggregate(self, iteration: int, layer: int) -> bool:
        return (iteration, layer) in self.aggregates

    def _record_aggregate(self, key: Key, event: Aggregate) -> bool:
        seen = self.aggregates.get(key)
        if seen is None:
            self.aggregates[key] = event
            return True
        self.duplicates += 1
        assert seen.sites == event.sites and bytes(seen.payload.values_f32()) == bytes(
            event.payload.values_f32()
        ), f"two different aggregates for {key}"
        return False

    def _payload(self, iteration: int, layer: int) -> SparsePayload:
        return self.payload(self.site, iteration, layer)

    def _record_push(self, key: Key, payload: SparsePayload) -> None:
        self.pushed[key] = payload
