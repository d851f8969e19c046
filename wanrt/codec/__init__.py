"""The COO payload codec: how one layer's sparse gradient crosses the WAN (format in ``docs/codec.md``).

``encode_payload`` turns a :class:`~wanrt.payload.SparsePayload` into a small msgpack-able meta dict and two
raw byte buffers (values first, then the block-index stream) that the protocol appends to a frame without
copying; ``decode_payload`` validates everything a peer sent before allocating and hands the values back as
a zero-copy view. The payload layout follows StellaTrain §3.2 (COO of 16-float cache-line blocks).
"""

from wanrt.codec.index_encodings import INDEX_ENCODINGS, IndexEncoding
from wanrt.codec.limits import (
    CODEC_VERSION,
    MAX_BLOCK_SIZE,
    MAX_DENSE_LEN,
    MAX_LAYER_ID,
    MAX_PAYLOAD_ELEMENTS,
)
from wanrt.codec.payload_codec import META_KEYS, decode_payload, encode_payload

__all__ = [
    "CODEC_VERSION",
    "INDEX_ENCODINGS",
    "MAX_BLOCK_SIZE",
    "MAX_DENSE_LEN",
    "MAX_LAYER_ID",
    "MAX_PAYLOAD_ELEMENTS",
    "META_KEYS",
    "IndexEncoding",
    "decode_payload",
    "encode_payload",
]
