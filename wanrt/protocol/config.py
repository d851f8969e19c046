"""Per-connection protocol settings: a frozen dataclass, loadable from the ``[protocol]`` TOML table."""

from __future__ import annotations

from dataclasses import dataclass

from wanrt.config import check
from wanrt.protocol.limits import (
    MAX_FRAME_BYTES,
    MAX_HANDSHAKE_FRAME_BYTES,
    MAX_PARTIAL_ITEMS,
    MAX_REASSEMBLY_BYTES,
    MAX_VERSIONS,
)

__all__ = ["PROTOCOL_VERSION", "SUPPORTED_VERSIONS", "ProtocolConfig"]

#: The version this code speaks. Frame layout and handshake messages are identical in every version, so
#: negotiation itself can never break; later versions may change stream message schemas.
PROTOCOL_VERSION = 1
SUPPORTED_VERSIONS: tuple[int, ...] = (PROTOCOL_VERSION,)


@dataclass(frozen=True)
class ProtocolConfig:
    """Limits one connection enforces; each may only be *lowered* from the hard limits in limits.py.

    ``versions`` exists so that tests (and a future rolling upgrade) can offer several versions.
    ``reassemble_chunks=False`` hands Chunk messages to the application instead (a relay forwarding them).
    """

    max_frame_bytes: int = MAX_FRAME_BYTES
    max_partial_items: int = MAX_PARTIAL_ITEMS
    max_reassembly_bytes: int = MAX_REASSEMBLY_BYTES
    reassemble_chunks: bool = True
    versions: tuple[int, ...] = SUPPORTED_VERSIONS

    def __post_init__(self) -> None:
        check(
            MAX_HANDSHAKE_FRAME_BYTES <= self.max_frame_bytes <= MAX_FRAME_BYTES,
            "max_frame_bytes",
            self.max_frame_bytes,
            f"must be in [{MAX_HANDSHAKE_FRAME_BYTES}, {MAX_FRAME_BYTES}]",
        )
        check(
            1 <= self.max_partial_items <= MAX_PARTIAL_ITEMS,
            "max_partial_items",
            self.max_partial_items,
            f"must be in [1, {MAX_PARTIAL_ITEMS}]",
        )
        check(
            self.max_frame_bytes <= self.max_reassembly_bytes <= MAX_REASSEMBLY_BYTES,
            "max_reassembly_bytes",
            self.max_reassembly_bytes,
            f"must be in [max_frame_bytes, {MAX_REASSEMBLY_BYTES}] so that one maximal item fits",
        )
        versions = tuple(self.versions)
        check(
            0 < len(versions) <= MAX_VERSIONS
            and len(set(versions)) == len(versions)
            and all(type(v) is int and 1 <= v <= 255 for v in versions),
            "versions",
            self.versions,
            f"must be 1-{MAX_VERSIONS} distinct integers in 1..255",
        )
        object.__setattr__(self, "versions", versions)
