"""Value codings in the handshake: the gateway says what it decodes, the trainer checks before it sends.

Why: fp32/fp16/bf16 payloads are decoded by every gateway version, so the wire dtype never needed
agreeing on; a low-bit payload (``wanrt.codec.lowbit``) is refused by a gateway that predates it, and a
refusal in the middle of training (a malformed payload, the connection closed) would cost the round. So
the gateway's Welcome lists what it decodes (``info["value_codings"]``, comma-separated) and a trainer
configured for a low-bit ``wire_dtype`` fails at connect with :class:`~wanrt.errors.UnsupportedValueCoding`
when its coding is not in the list (a gateway that sends no list decodes none). The trainer's Hello
names its coding (``info["value_coding"]``) so the gateway's logs and peers can tell. Sans-IO.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from wanrt.codec.lowbit import VALUE_CODINGS
from wanrt.errors import UnsupportedValueCoding

__all__ = ["VALUE_CODINGS_KEY", "VALUE_CODING_KEY", "check_value_coding", "offered_codings"]

#: Welcome info key: the low-bit codings this gateway decodes (comma-separated names).
VALUE_CODINGS_KEY: Final = "value_codings"
#: Hello info key: the low-bit coding this trainer pushes (absent for fp32/fp16/bf16).
VALUE_CODING_KEY: Final = "value_coding"


def offered_codings() -> str:
    """What a gateway of this version puts under :data:`VALUE_CODINGS_KEY`."""
    return ",".join(VALUE_CODINGS)


def check_value_coding(wanted: str, info: Mapping[str, Any], *, peer: str | None = None) -> None:
    """Raise :class:`UnsupportedValueCoding` unless the peer's handshake ``info`` lists ``wanted`` (a
    float dtype is always fine)."""
    if wanted not in VALUE_CODINGS:
        return
    text = info.get(VALUE_CODINGS_KEY)
    offered = tuple(x for x in text.split(",") if x) if isinstance(text, str) else ()
    if wanted not in offered:
        raise UnsupportedValueCoding(
            f"the gateway does not decode {wanted} values (it offers: {', '.join(offered) or 'none'}); "
            "use wire_dtype fp32, fp16 or bf16 or upgrade the gateway",
            coding=wanted,
            supported=offered,
            peer=peer,
        )
