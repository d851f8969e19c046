"""What the round engine knows about each layer's payloads: their shape and the dtype they travel in.

Why its own place. Every payload of a layer, whoever sends it, must describe the same dense layer — a
``(dense_len, block_size)`` that disagrees with the first one seen would make the exact sparse sums of
:mod:`gateways.rounds.aggregate` add blocks of different layers — and with ``partial_sums = "wire"`` every
partial sum is narrowed to the dtype the site's trainers push, so a sum that was not added to anything
leaves with the very bits it came in with. Both facts are learned from the first payload of a layer and
then checked or applied to every later one; the engine asks here and decides what to do with the answer.

Sans-IO: plain data.
"""

from __future__ import annotations

import dataclasses

from wanrt.codec.lowbit import usable_coded
from wanrt.codec.value_casts import in_wire_dtype
from wanrt.errors import MalformedPayload
from wanrt.payload import SparsePayload
from wanrt.protocol.peer.round_msg import RoundMsg

__all__ = ["LayerFormats"]


class LayerFormats:
    """Per layer: the ``(dense_len, block_size)`` its payloads must have and its wire value dtype."""

    def __init__(self, *, wire_sums: bool) -> None:
        #: ``partial_sums = "wire"``: messages leave in the layer's wire dtype (else as summed, fp32)
        self.wire_sums = wire_sums
        self.shapes: dict[int, tuple[int, int]] = {}
        self.wire: dict[int, str] = {}  # layer -> the value dtype its payloads travel in
        # layer -> (low-bit coding, scale block) of its payloads: the site's trainers' once they pushed,
        # else the first coded payload a peer sent (``result_coding = "wire"`` re-codes results in it)
        self.codings: dict[int, tuple[str, int]] = {}

    def shape(self, layer: int) -> tuple[int, int] | None:
        return self.shapes.get(layer)

    def layers(self) -> set[int]:
        return set(self.shapes)

    def check(self, layer: int, p: SparsePayload, who: str) -> None:
        """The first payload of ``layer`` fixes its shape; a later one that disagrees is malformed."""
        shape = self.shapes.get(layer)
        if shape is None:
            self.shapes[layer] = (p.dense_len, p.block_size)
        elif shape != (p.dense_len, p.block_size):
            raise MalformedPayload(
                f"layer {layer}: (dense_len, block_size) {(p.dense_len, p.block_size)} != known {shape}",
                peer=who,
                value=(p.dense_len, p.block_size),
            )
        self._learn_coding(layer, p, own=False)

    def pushed(self, layer: int, p: SparsePayload) -> None:
        """The site's trainers pushed ``p`` of ``layer``: its dtype (and low-bit coding) from now on."""
        self.wire[layer] = p.value_dtype
        self._learn_coding(layer, p, own=True)

    def _learn_coding(self, layer: int, p: SparsePayload, *, own: bool) -> None:
        coded = usable_coded(p)
        if coded is not None and (own or layer not in self.codings):
            self.codings[layer] = (coded.coding, coded.scale_block)

    def coding(self, layer: int) -> tuple[str, int] | None:
        """``layer``'s low-bit coding and scale block, None when its payloads are not low-bit (or none was
        seen yet). A push that fell back to fp32 (a value not codable) does not forget it."""
        return self.codings.get(layer)

    def default(self, layer: int, dtype: str) -> None:
        """``dtype`` unless the layer's wire dtype is known already (a streamed push's first piece)."""
        self.wire.setdefault(layer, dtype)

    def narrow(self, msg: RoundMsg) -> RoundMsg:
        """``msg`` with its payload in the layer's wire dtype (``partial_sums = "wire"``): the dtype this
        site's trainers push, else the one its peers send. A final is narrowed once, where it is made,
        so every site delivers the very same values."""
        p = msg.payload
        if p is None or not self.wire_sums:
            return msg
        dtype = self.wire.get(msg.layer) or self.wire.setdefault(msg.layer, p.value_dtype)
        if dtype == p.value_dtype:
            return msg
        return dataclasses.replace(msg, payload=in_wire_dtype(p, dtype))
