"""The codec's settings as a frozen config section (TOML ``[codec]`` inside a gateway or trainer config).

A site chooses its wire precision once, in its config, rather than per call, so the setting is validated on
load with an error that names the key (``codec.wire_dtype``) instead of failing on the first payload.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from wanrt.codec.index_encodings import INDEX_ENCODINGS, IndexEncoding
from wanrt.codec.limits import MAX_PAYLOAD_ELEMENTS
from wanrt.config import check

__all__ = ["CodecConfig"]


@dataclass(frozen=True)
class CodecConfig:
    """Wire precision, index encoding policy and receive limit of one endpoint."""

    #: dtype of the values on the wire: "same" sends each payload in its own dtype (fp32 is exact); "fp16"
    #: halves the bytes at 2**-11 relative precision (falls back per payload on overflow); "bf16" halves
    #: them at 2**-8 over the full fp32 range. See docs/codec.md.
    wire_dtype: Literal["same", "fp32", "fp16", "bf16"] = "same"
    #: "auto" sends the smallest index encoding per payload; naming one forces it (benchmarks, debugging)
    index_encoding: Literal["auto", "u32", "d16", "varint", "bitmap"] = "auto"
    #: largest payload accepted from a peer, in value slots; at most the format limit
    max_payload_elements: int = MAX_PAYLOAD_ELEMENTS

    def __post_init__(self) -> None:
        check(
            self.wire_dtype in ("same", "fp32", "fp16", "bf16"),
            "wire_dtype",
            self.wire_dtype,
            "must be same, fp32, fp16 or bf16",
        )
        check(
            self.index_encoding == "auto" or self.index_encoding in INDEX_ENCODINGS,
            "index_encoding",
            self.index_encoding,
            f"must be auto or one of {', '.join(INDEX_ENCODINGS)}",
        )
        check(
            type(self.max_payload_elements) is int and 1 <= self.max_payload_elements <= MAX_PAYLOAD_ELEMENTS,
            "max_payload_elements",
            self.max_payload_elements,
            f"must be an integer in [1, {MAX_PAYLOAD_ELEMENTS}]",
        )

    def encode_options(self) -> dict[str, Any]:
        """Keyword arguments for :func:`~wanrt.codec.encode_payload`."""
        wire: str | None = None if self.wire_dtype == "same" else self.wire_dtype
        enc: IndexEncoding | None = None if self.index_encoding == "auto" else self.index_encoding
        return {"wire_dtype": wire, "index_encoding": enc}
