"""Equal small payload bytes decode to one shared read-only payload; bytes that differ anywhere, even
only between the ends the cache key hashes, never do."""

from __future__ import annotations

import numpy as np

from wanrt.payload import SparsePayload
from wanrt.protocol.messages import payload_from_wire, payload_wire_form


def _wire(values: np.ndarray) -> tuple[dict, list[memoryview]]:
    p = SparsePayload(0, 4096, 16, np.arange(len(values) // 16, dtype=np.int64), values.astype(np.float32))
    meta, buffers = payload_wire_form(p)
    return dict(meta), [memoryview(bytes(b)) for b in buffers]  # fresh bytes, as a receiver has them


def test_equal_bytes_share_one_decoded_payload() -> None:
    vals = np.arange(4096, dtype=np.float32)
    a = payload_from_wire(*_wire(vals), None)
    b = payload_from_wire(*_wire(vals.copy()), None)
    assert a is b and not a.values.flags.writeable


def test_bytes_that_differ_only_in_the_middle_decode_apart() -> None:
    vals = np.arange(4096, dtype=np.float32)
    other = vals.copy()
    other[2048] = -1.0  # far from both hashed ends of the 16 KiB values buffer
    a = payload_from_wire(*_wire(vals), None)
    b = payload_from_wire(*_wire(other), None)
    assert a is not b
    assert a.values[2048] == 2048.0 and b.values[2048] == -1.0
    assert payload_from_wire(*_wire(other), None) is b
