"""Named bounds on everything a COO payload announces about itself.

A peer's meta dict is checked against these *before* anything is allocated, so a lying peer can make a
gateway allocate at most a small multiple of the bytes it actually sent (see ``docs/codec.md``).
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "CODEC_VERSION",
    "MAX_BLOCK_SIZE",
    "MAX_DENSE_LEN",
    "MAX_LAYER_ID",
    "MAX_PAYLOAD_ELEMENTS",
]

#: Wire format version carried in every meta dict as ``fmt``; bumped on any incompatible change so an old
#: gateway rejects a new payload with a typed error instead of misreading it.
CODEC_VERSION: Final = 1

#: Largest number of value slots (``count * block_size``, padding included) one payload may carry.
#: 2**28 slots = 1 GiB of fp32: a whole 256M-parameter layer (larger than any embedding table we target)
#: at full density still fits, while a peer that merely *claims* more is refused before ``np.empty``.
#: The protocol's frame-size limit is usually the tighter bound; callers may pass a smaller one.
MAX_PAYLOAD_ELEMENTS: Final = 1 << 28

#: Largest dense length of one layer. 2**40 is far above any real layer, and keeps block-index arithmetic
#: (prefix sums of up to 2**28 gaps) far from int64 overflow in all but adversarial inputs, which the
#: strict-monotonicity check then catches (see ``index_encodings``).
MAX_DENSE_LEN: Final = 1 << 40

#: Largest block width. wanrt uses 16 (one 64-byte cache line of fp32, StellaTrain §3.2) and 1; the same
#: bound as ``wanrt.kernels.config.MAX_BLOCK_SIZE``, so whatever a compressor may emit, the codec accepts.
MAX_BLOCK_SIZE: Final = 4096

#: Largest layer id. Layer ids index per-layer state (thresholds, residuals) in every gateway, so they are
#: small in practice; 2**32 keeps them inside msgpack's compact uint32 encoding.
MAX_LAYER_ID: Final = (1 << 32) - 1
