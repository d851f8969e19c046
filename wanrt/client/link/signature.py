"""The model's layer signature: which parameters, in which order, with which shapes.

Sites only ever exchange (layer id, block indices, values); if two sites built different models, layer 7
means different tensors on each side and training silently produces garbage. So the site leader sends a
signature in its handshake, the gateways compare it, and a mismatch becomes :class:`ModelMismatch` naming the
first differing layer. Ranks inside a site compare the leader's digest too.

The signature is a digest per layer (8 bytes of BLAKE2b over name, shape and dtype) plus one digest of the
whole list: per-layer digests keep it small (8 bytes per layer, not the names) yet still let the receiving
side say *which* layer differs first. A handshake info value holds at most 1 KiB, so on the wire consecutive
layers are grouped (one digest per group of ``ceil(n / 128)`` layers): models up to 128 layers are compared
layer by layer, bigger ones narrow a difference down to one group.

Wire form, in the Hello ``info`` map of the site leader and, once the gateway knows the job's model, in its
Welcome ``info`` (the client compares and names the first differing layer of its own model):
``{"model": 16-byte digest, "n_layers": int, "group": layers per group, "layers": group digests}``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "INFO_KEYS",
    "LAYER_DIGEST_BYTES",
    "LayerSignature",
    "compare_info",
    "first_difference",
]

#: 8 bytes per layer: collisions between two *different* layers at the same position are ~2^-64.
LAYER_DIGEST_BYTES: Final = 8
#: group digests per handshake: 128 * 8 bytes = the protocol's 1 KiB limit on one info value
MAX_WIRE_GROUPS: Final = 128
INFO_KEYS: Final = ("model", "n_layers", "group", "layers")


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

    def group_size(self) -> int:
        return max(1, -(-len(self.names) // MAX_WIRE_GROUPS))

    def info(self) -> dict[str, Any]:
        """The handshake ``info`` entries describing this model (see the module docstring)."""
        g = self.group_size()
        per_layer = self.layer_digests()
        step = g * LAYER_DIGEST_BYTES
        groups = b"".join(
            hashlib.blake2b(per_layer[i : i + step], digest_size=LAYER_DIGEST_BYTES).digest()
            for i in range(0, len(per_layer), step)
        )
        return {"model": self.digest(), "n_layers": len(self.names), "group": g, "layers": groups}

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


def compare_info(ours: LayerSignature, theirs: dict[str, Any]) -> tuple[int, str] | None:
    """``None`` when ``theirs`` (an info map) describes our model, else (first differing layer, text).

    A map lacking the signature keys describes nothing to compare against (the gateway does not know the
    job's model yet), which is not a mismatch. Malformed values count as a mismatch at layer 0.
    """
    if not all(k in theirs for k in INFO_KEYS):
        return None
    if theirs["model"] == ours.digest():
        return None
    mine = ours.info()
    n, g, layers = theirs["n_layers"], theirs["group"], theirs["layers"]
    if not (isinstance(n, int) and isinstance(g, int) and isinstance(layers, bytes) and g >= 1):
        return 0, "the other side's model signature is malformed"
    if g != mine["group"]:  # different layer counts can give different groupings
        at = min(n, len(ours.names)) if n != len(ours.names) else 0
        return at, f"the other model has {n} layers, this one {len(ours.names)}"
    group = first_difference(mine["layers"], layers)
    if group is None:  # same groups, different digest: only the layer count can differ
        at = min(n, len(ours.names))
        return at, f"the other model has {n} layers, this one {len(ours.names)}"
    first = group * g
    if g == 1:
        return first, f"first difference at {ours.describe(first)}"
    last = min(first + g, len(ours.names)) - 1
    return first, f"first difference within layers {first}..{last}, starting at {ours.describe(first)}"
