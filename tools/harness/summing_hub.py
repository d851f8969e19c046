"""An in-memory stand-in for the gateways (outer-loop tests, the two-site resync test,
tools/outer_inprocess.py): several sites in one process push to it; it sums every site's push of an
(iteration, layer) as the rounds do (fp32, over the union of the pushed blocks) and hands each site the
result naming every site (an empty push is named too, as a round's result names every push it sums). Each
site's loop runs in its own thread; every push and result is kept for the test to read."""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence

import numpy as np

from wanrt.client.link.api import LinkEvent, LinkSpec, UpdateArrived
from wanrt.payload import SparsePayload


class Hub:
    def __init__(self, sites: Sequence[str]) -> None:
        self.sites = tuple(sites)
        self.lock = threading.Lock()
        self.pending: dict[tuple[int, int], dict[str, SparsePayload]] = {}
        self.pushes: dict[tuple[str, int, int], SparsePayload] = {}
        self.results: dict[tuple[int, int], SparsePayload] = {}
        self.links: dict[str, HubLink] = {}
        self.telemetry: dict[str, list[tuple[int, dict[str, float]]]] = {s: [] for s in self.sites}

    def push(self, site: str, iteration: int, layer: int, payload: SparsePayload) -> None:
        with self.lock:
            self.pushes[(site, iteration, layer)] = payload
            got = self.pending.setdefault((iteration, layer), {})
            got[site] = payload
            if len(got) < len(self.sites):
                return
            del self.pending[(iteration, layer)]
            dense = np.zeros(payload.dense_len, np.float32)
            blocks: set[int] = set()
            for s in self.sites:  # a fixed order: the sum is the same whoever pushed last
                got[s].add_into(dense)
                blocks.update(got[s].indices.tolist())
            ids = np.array(sorted(blocks), dtype=np.int64)
            total = SparsePayload.from_dense_blocks(layer, dense, ids, payload.block_size)
            self.results[(iteration, layer)] = total
            for link in self.links.values():
                link.events.put(UpdateArrived(iteration, layer, total, self.sites))

    def link(self, spec: LinkSpec) -> HubLink:
        return HubLink(spec, self)


class HubLink:
    def __init__(self, spec: LinkSpec, hub: Hub) -> None:
        self.spec, self.hub = spec, hub
        self.events: queue.Queue[LinkEvent] = queue.Queue()
        hub.links[spec.site] = self

    def push(self, iteration: int, layer: int, payload: SparsePayload) -> None:
        self.hub.push(self.spec.site, iteration, layer, payload)

    def telemetry(self, iteration: int, metrics: dict[str, float]) -> None:
        self.hub.telemetry[self.spec.site].append((iteration, metrics))

    def get(self, timeout: float) -> LinkEvent | None:
        try:
            return self.events.get(timeout=timeout) if timeout > 0 else self.events.get_nowait()
        except queue.Empty:
            return None

    def close(self, timeout: float) -> None:
        pass
