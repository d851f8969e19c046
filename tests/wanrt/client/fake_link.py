"""In-process stand-ins for the gateway link, for tests that drive one site without sockets.

``ScriptedLink`` echoes each push back as a one-site aggregate, with a per-layer timing script: "instant"
(back before the step ends: applied fresh), "late" (back only once the leader blocks waiting, oldest
iteration first: applied one step later under staleness 1) or "never" (the deadline must fire).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Literal

from wanrt.client.link.api import LinkEvent, LinkSpec, UpdateArrived
from wanrt.client.site.decision import ConfigChange
from wanrt.payload import SparsePayload

Timing = Literal["instant", "late", "never"]


class ScriptedLink:
    def __init__(self, spec: LinkSpec, timing: Mapping[int, Timing] | None = None) -> None:
        self.spec = spec
        self.timing = dict(timing or {})
        self.pushed: list[tuple[int, int, SparsePayload]] = []
        self._ready: list[LinkEvent] = []
        self._late: list[UpdateArrived] = []
        self._lock = threading.Lock()
        self.closed = False
        self.telemetry_seen: list[tuple[int, dict[str, float]]] = []

    def push(self, iteration: int, layer: int, payload: SparsePayload) -> None:
        with self._lock:
            self.pushed.append((iteration, layer, payload))
            ev = UpdateArrived(iteration, layer, payload, (self.spec.site,))
            timing = self.timing.get(layer, "instant")
            if timing == "instant":
                self._ready.append(ev)
            elif timing == "late":
                self._late.append(ev)

    def telemetry(self, iteration: int, metrics: dict[str, float]) -> None:
        with self._lock:
            self.telemetry_seen.append((iteration, dict(metrics)))

    def announce(self, change: ConfigChange) -> None:
        with self._lock:
            self._ready.append(change)

    def get(self, timeout: float) -> LinkEvent | None:
        with self._lock:
            if not self._ready and timeout > 0 and self._late:
                # the leader blocks: the oldest late iteration arrives now, newer ones stay in flight
                oldest = min(ev.iteration for ev in self._late if isinstance(ev, UpdateArrived))
                self._ready.extend(
                    e for e in self._late if isinstance(e, UpdateArrived) and e.iteration == oldest
                )
                self._late = [e for e in self._late if isinstance(e, UpdateArrived) and e.iteration != oldest]
            if self._ready:
                return self._ready.pop(0)
        if timeout > 0:
            threading.Event().wait(min(timeout, 0.01))  # a blocked leader with nothing left to deliver
        return None

    def close(self, timeout: float) -> None:
        self.closed = True


def scripted(
    timing: Mapping[int, Timing] | None = None, sink: list[ScriptedLink] | None = None
) -> Callable[[LinkSpec], ScriptedLink]:
    def factory(spec: LinkSpec) -> ScriptedLink:
        link = ScriptedLink(spec, timing)
        if sink is not None:
            sink.append(link)
        return link

    return factory
