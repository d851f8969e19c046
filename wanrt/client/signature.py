"""The model's layer signature: which parameters, in which order, with which shapes.

Sites only ever exchange (layer id, block indices, values); if two sites built different models, layer 7
means different tensors on each side and training silently produces garbage. So the site leader sends a
signature in its handshake, the gateways compare it, and a mismatch becomes :class:`ModelMismatch` naming the
first differing layer. Ranks inside a site compare the leader's digest too.

The signature is a digest per layer (8 bytes of BLAKE2b over name, shape and dtype) plus one digest of the
whole list: per-layer digests keep it small on the wire (8 bytes per layer, not the names) yet still let the
receiving side say *which* layer differs first.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

__all__ = ["LAYER_DIGEST_BYTES", "LayerSignature", "first_difference"]

#: 8 bytes per layer: collisions between two *different* layers at the same position are ~2^-64.
LAYER_DIGEST_BYTES: Final = 8


@dataclass(frozen=True)
class LayerSignature:
    """Names, shapes and dtypes of the trained parameters in layer-id order."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]

    @classmethod
    def of(
        cls, names: Sequence[str], shapes: Sequence[Sequence[int]], dtypes: Sequence[str]
    ) -> LayerSignature:
        return cls(tuple(names), tuple(tuple(int(d) for d in s) for s in shapes), tuple(dtypes))

    def layer_digests(self) -> bytes:
        """Concatenated per-layer digests (what goes on the wire)."""
        out = bytearray()
        for name, shape, dtype in zip(self.names, self.shapes, self.dtypes, strict=True):
            text = f"{name}|{','.join(map(str, shape))}|{dtype}".encode()
            out += hashlib.blake2b(text, digest_size=LAYER_DIGEST_BYTES).digest()
        return bytes(out)

    def digest(self) -> bytes:
        """One 16-byte digest of the whole model, cheap to compare."""
        return hashlib.blake2b(self.layer_digests(), digest_size=16).digest()

    def describe(self, layer: int) -> str:
        if 0 <= layer < len(self.names):
            return f"layer {layer} {self.names[layer]!r} shape {self.shapes[layer]} {self.dtypes[layer]}"
        return f"layer {layer} (absent: this model has {len(self.names)} layers)"


def first_difference(ours: bytes, theirs: bytes) -> int | None:
    """Index of the first layer whose digest differs, or ``None`` when both lists are identical.

    A list that is a prefix of the other differs at the first layer the shorter one lacks.
    """
    n = LAYER_DIGEST_BYTES
    count = min(len(ours), len(theirs)) // n
    for i in range(count):
        if ours[i * n : (i + 1) * n] != theirs[i * n : (i + 1) * n]:
            return i
    if len(ours) != len(theirs):
        return count
    return None
