"""How a sparse update reaches the device: pinned host memory, a copy stream, and reused device buffers.

StellaTrain §3.1's sparse step touches 1 % of a layer; on a GPU the step is then bounded by how its
indices and values get there, not by the kernel (issue 26: on an H200 the Adam kernel took 4 µs for a
25 M-element layer at 1 %, the host-to-device copy of its 1.1 MB 38 µs, and the host's copy into the
pinned buffer more than both). So:

* **Pinned host memory, filled in place.** :class:`PinnedUpdate` is a pinned host buffer its owner keeps
  (the client's :class:`~wanrt.client.site.update_apply.UpdateApplier` keeps one per layer) and writes the
  averaged update into. An upload of its arrays is a DMA straight out of it; any other host array is first
  copied into one of the staging's own pinned buffers (a pageable array would be copied synchronously by
  the driver, through its own pinned buffer, while the host waits).
* **A copy stream.** The DMA runs on a stream of its own and the consumer's stream waits for it (an
  event): the copy of layer ``i + 1``'s update overlaps the kernel of layer ``i`` (copy engine and SMs
  work at once), where one stream ran them one after the other.
* **Reused device buffers, round robin** (:data:`PinnedStaging.SLOTS`): a buffer is written again only
  after the kernel that read it (the event :meth:`PinnedStaging.consumed` records right after the launch,
  or, when nobody said, everything its stream had queued when it is reused) and a pinned buffer is
  refilled by the host only after its last copy out of it finished.
"""

from __future__ import annotations

import threading
from types import ModuleType
from typing import Any

import numpy as np

from wanrt.errors import KernelError
from wanrt.kernels.arrays import Array

__all__ = ["PinnedStaging", "PinnedUpdate"]

#: values start 256-byte aligned after the indices (the kernels' float4 loads want 16)
_ALIGN = 256


def _values_offset(ni: int) -> int:
    return -(-ni * 8 // _ALIGN) * _ALIGN


class PinnedUpdate:
    """A reusable pinned host buffer for one sparse update's indices (int64) and values (float32).

    The owner asks :meth:`arrays` for views to fill before each step (they wait until the buffer's last
    copy to the device has finished, so a step never overwrites what is still being sent), fills them,
    and hands them to the optimizer in a :class:`~wanrt.payload.SparsePayload`; the upload recognises
    them and sends them without a host copy. Grows (reallocates) when an update outgrows it.
    """

    def __init__(self, staging: PinnedStaging, *, owned: bool = True) -> None:
        self._staging = staging
        self._registered = owned  # an owner's buffer: uploads look it up by address (a slot's own is not)
        self.host: Any = None  # cupy.cuda.PinnedMemoryPointer
        self.nbytes = 0
        self.copied: Any = None  # event recorded after the last copy out of this buffer
        self.ptr = 0  # the pinned buffer's address
        #: the arrays handed out last: an upload recognises them by identity (no address lookups)
        self.views: tuple[np.ndarray, np.ndarray] | None = None

    def bytes_for(self, ni: int, nv: int) -> int:
        """The pinned bytes this buffer holds once it has handed out arrays of these sizes (it grows by
        doubling, so that sizes that vary from step to step do not reallocate every time)."""
        need = _values_offset(ni) + nv * 4
        return self.nbytes if need <= self.nbytes else max(need, 2 * self.nbytes, 1 << 16)

    def arrays(self, ni: int, nv: int) -> tuple[np.ndarray, np.ndarray]:
        """Views of ``ni`` indices and ``nv`` values in pinned memory, free to overwrite."""
        if ni < 0 or nv < 0:
            raise KernelError("a staged update needs non-negative sizes", value=(ni, nv))
        if self.copied is not None:
            self.copied.synchronize()  # the last copy out of this buffer has finished
            self.copied = None
        size = self.bytes_for(ni, nv)
        if size > self.nbytes:
            self.nbytes = size
            self.host = self._staging.alloc_pinned(self.nbytes)
            self.ptr = int(self.host.ptr)
        if self._registered:
            self._staging.forget(self)
        host, off = self.host, _values_offset(ni)
        self.views = (np.frombuffer(host, np.int64, ni, 0), np.frombuffer(host, np.float32, nv, off))
        if self._registered:
            self._staging.remember(self)
        return self.views


class _Slot:
    """One round-robin staging slot: its own pinned host buffer (for arrays that are not pinned) and the
    device buffer the kernel reads, with the events that say when each may be reused."""

    __slots__ = ("consumed", "d_i", "d_v", "dev", "host", "keep", "shape", "stream")

    def __init__(self, staging: PinnedStaging) -> None:
        self.host = PinnedUpdate(staging, owned=False)
        self.dev: Array = None  # uint8 device buffer: indices, then values (one copy for both)
        self.d_i: Array = None  # the index view handed out last (consumed() finds the slot by it)
        self.d_v: Array = None  # the value view handed out last
        self.shape: tuple[int, int, int] = (-1, -1, -1)  # (ni, nv, offset) of d_i and d_v
        self.consumed: Any = None  # event after the last kernel that read ``dev``
        self.stream: Any = None  # the stream that kernel ran on
        #: the pinned memory of the last copy into ``dev`` and that copy's event: held until the copy is
        #: done, so an owner that drops its buffer meanwhile cannot have it reused under the DMA
        self.keep: tuple[Any, Any] | None = None


class PinnedStaging:
    """Uploads sparse updates (see the module docstring); thread-safe, one per :class:`CupyKernels`."""

    #: device buffers in the round robin: a model applies its layers one after another, and four let the
    #: copies of the next layers run while the current one's kernel does
    SLOTS = 4

    def __init__(self, cupy: ModuleType) -> None:
        self._cp = cupy
        self._slots = [_Slot(self) for _ in range(self.SLOTS)]
        self._next = 0
        self._lock = threading.Lock()
        self._copy_streams: dict[int, Any] = {}
        self._pinned: dict[int, PinnedUpdate] = {}  # id of its index array -> the owner's buffer

    # ------------------------------------------------------------------ owners' pinned buffers

    def pinned_update(self) -> PinnedUpdate:
        """A pinned host buffer to fill an update in place (see :class:`PinnedUpdate`)."""
        return PinnedUpdate(self)

    def alloc_pinned(self, nbytes: int) -> Any:
        return self._cp.cuda.alloc_pinned_memory(nbytes)

    def remember(self, buf: PinnedUpdate) -> None:
        if buf.views is not None:
            with self._lock:
                self._pinned[id(buf.views[0])] = buf

    def forget(self, buf: PinnedUpdate) -> None:
        if buf.views is not None:
            with self._lock:
                if self._pinned.get(id(buf.views[0])) is buf:
                    del self._pinned[id(buf.views[0])]

    def _owner_buffer(self, idx: np.ndarray, vals: np.ndarray) -> PinnedUpdate | None:
        """The owner's buffer whose current arrays ``idx`` and ``vals`` are (the very objects it handed
        out, which its ``views`` keep alive, so the id cannot belong to another array), else None."""
        buf = self._pinned.get(id(idx))
        if buf is None or buf.views is None or buf.views[0] is not idx or buf.views[1] is not vals:
            return None
        return buf

    # ------------------------------------------------------------------ upload

    def _copy_stream(self, dev: int) -> Any:
        s = self._copy_streams.get(dev)
        if s is None:
            s = self._copy_streams[dev] = self._cp.cuda.Stream(non_blocking=True)
        return s

    def upload(self, idx: np.ndarray, vals: np.ndarray) -> tuple[Array, Array]:
        """Device arrays holding ``idx`` (int64) and ``vals`` (float32), ready for work queued on the
        current stream from now on. The caller should say :meth:`consumed` after queueing that work."""
        cp = self._cp
        ni, nv = int(idx.shape[0]), int(vals.shape[0])
        with self._lock:
            stream = cp.cuda.get_current_stream()
            dev = cp.cuda.runtime.getDevice()
            copy = self._copy_stream(dev)
            slot = self._slots[self._next]
            self._next = (self._next + 1) % len(self._slots)
            if slot.keep is not None:
                slot.keep[1].synchronize()  # (long done: SLOTS uploads ago)
                slot.keep = None
            src = self._owner_buffer(idx, vals)
            if src is None:  # not the owner's pinned arrays: into this slot's own pinned buffer first
                src = slot.host
                host_i, host_v = src.arrays(ni, nv)
                np.copyto(host_i, idx, casting="same_kind")
                np.copyto(host_v, vals, casting="same_kind")
            off = _values_offset(ni)  # (the layout every PinnedUpdate hands out)
            need = off + nv * 4
            if slot.dev is None or int(slot.dev.shape[0]) < need or slot.dev.device.id != dev:
                slot.dev = cp.empty(max(need, 1 << 16), dtype=cp.uint8)
                slot.consumed = None
                slot.stream = None
                slot.shape = (-1, -1, -1)
            # the device buffer's last reader: the kernel's event, or all its stream had queued by now
            before = slot.consumed
            if before is None and slot.stream is not None:
                before = cp.cuda.Event(block=False, disable_timing=True)
                before.record(slot.stream)
            if before is not None:
                copy.wait_event(before)
            cp.cuda.runtime.memcpyAsync(
                slot.dev.data.ptr, src.ptr, need, cp.cuda.runtime.memcpyHostToDevice, copy.ptr
            )
            done = cp.cuda.Event(block=False, disable_timing=True)
            done.record(copy)
            src.copied = done
            slot.keep = (src.host, done)
            stream.wait_event(done)
            slot.consumed, slot.stream = None, stream
            if slot.shape != (ni, nv, off):  # (views of the same sizes are reused: two CuPy slicings less)
                slot.d_i = slot.dev[: ni * 8].view(cp.int64)
                slot.d_v = slot.dev[off : off + nv * 4].view(cp.float32)
                slot.shape = (ni, nv, off)
            return slot.d_i, slot.d_v

    def consumed(self, d_i: Array) -> None:
        """The work that reads the upload whose indices are ``d_i`` is queued on the current stream:
        its slot's device buffer may be overwritten once that work is done (without this, once everything
        its stream had queued is done)."""
        with self._lock:
            for slot in self._slots:
                if slot.d_i is d_i:
                    ev = self._cp.cuda.Event(block=False, disable_timing=True)
                    ev.record(self._cp.cuda.get_current_stream())
                    slot.consumed, slot.stream = ev, None
                    return
