"""Reused output buffers for the wire values of large dense layers (the leader's cast target).

Why: a dense layer's payload is the gradient cast to the wire dtype, a layer-sized array made every step.
Above glibc's mmap threshold (32 MB at most) every such array is a fresh ``mmap``, and the kernel zeroes
and maps its pages while the cast writes them: at 25 M elements the 50 MB fp16 cast took 130-200 ms in a
client round against ~6 ms into memory already mapped (docs/round_bench.md, "Through the client"). So a
layer keeps up to :data:`KEEP_PER_LAYER` buffers and the next payload is cast into one nobody uses any more.

Who may still use a buffer: the payload handed to the link holds it (``SparsePayload.values`` is the
buffer or a view of it, and NumPy views and exported ``memoryview`` s keep a reference to the array
they view), the link keeps the push until the gateway acknowledged it (to re-send it after a reconnect),
and its frames hold views until they are written. A buffer is therefore free exactly when the only
references left are this pool's; CPython counts them (``sys.getrefcount``), so no protocol between the
link and the leader is needed, and a buffer still in use is never written: the leader then takes
another one, or, with every kept buffer busy, a fresh array as before.
"""

from __future__ import annotations

import sys
from typing import Any, Final

import numpy as np
import numpy.typing as npt

__all__ = ["KEEP_PER_LAYER", "WireBuffers"]

#: Buffers kept per layer: one being sent or awaiting its acknowledgement, one being cast into. More
#: would only hold memory: with staleness s the link keeps s + 1 pushes, and the others get fresh arrays.
KEEP_PER_LAYER: Final = 2

#: References to a kept buffer when nobody else holds it: the pool's list, the loop variable, and the
#: argument of ``sys.getrefcount`` itself.
_ONLY_OURS: Final = 3


class WireBuffers:
    """Per-layer reusable arrays for dense wire values of at least ``min_bytes`` bytes."""

    def __init__(self, min_bytes: int) -> None:
        self.min_bytes = min_bytes
        self._kept: dict[int, list[npt.NDArray[Any]]] = {}
        self.reused = 0  # casts written into a kept buffer (tests, diagnostics)

    def take(self, layer: int, length: int, dtype: npt.DTypeLike) -> npt.NDArray[Any] | None:
        """A free buffer of ``length`` values of ``dtype`` for ``layer``, or None (too small to matter,
        or every kept buffer still in use: the caller allocates as before)."""
        dt = np.dtype(dtype)
        if self.min_bytes <= 0 or length * dt.itemsize < self.min_bytes:
            return None
        kept = self._kept.setdefault(layer, [])
        for buf in kept:
            if buf.shape[0] == length and buf.dtype == dt and sys.getrefcount(buf) <= _ONLY_OURS:
                self.reused += 1
                return buf
        kept[:] = [b for b in kept if b.shape[0] == length and b.dtype == dt]  # the layer changed shape
        if len(kept) >= KEEP_PER_LAYER:
            return None
        fresh = np.empty(length, dtype=dt)
        kept.append(fresh)
        return fresh

    def clear(self) -> None:
        """Drop every kept buffer (memory goes back once the link lets go of it too)."""
        self._kept.clear()
