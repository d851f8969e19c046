"""Handshake proofs: mutual HMAC-SHA256 challenge-response over the pre-shared job secret.

Exchange (docs/protocol.md has the frame-level view)::

    C -> S  Hello(job, site, role, versions, client_nonce, max_frame, info)
    S -> C  Welcome(job, site, role, versions, version, server_nonce, max_frame, info,
                    proof = HMAC(secret, "wanrt server proof" | T))
    C -> S  Auth(proof = HMAC(secret, "wanrt client proof" | T))

where ``T`` is a canonical msgpack encoding of every Hello field and every Welcome field except the proof.

Why this is enough:

* Each side proves knowledge of the secret over a nonce the *other* side just drew, so a recorded Welcome
  fails against a new client nonce and a recorded Auth fails against a new server nonce (no replay).
* Distinct labels keep a server proof from being reflected back as a client proof.
* ``T`` binds names, roles, offered and chosen versions and the info maps, so a man in the middle cannot
  downgrade the version or swap the site name or the advertised iteration without breaking the proofs.
* Comparisons use :func:`hmac.compare_digest` (constant time), so timing reveals nothing about the proof.

Not provided: confidentiality and integrity of later frames (use TLS on hostile paths), and forward secrecy.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any, Final

import msgpack

from wanrt.protocol.messages import Hello, Welcome

__all__ = ["client_proof", "proof_matches", "server_proof", "transcript"]

_SERVER_LABEL: Final = b"wanrt server proof\x00"
_CLIENT_LABEL: Final = b"wanrt client proof\x00"
_TRANSCRIPT_TAG: Final = "wanrt-handshake-1"


def _canonical_info(info: dict[str, Any]) -> list[list[Any]]:
    # Sorted so that the proof does not depend on dict insertion order on either side.
    return [[k, info[k]] for k in sorted(info)]


def transcript(hello: Hello, welcome: Welcome) -> bytes:
    """Canonical bytes of the whole handshake except the proofs themselves."""
    return msgpack.packb(
        [
            _TRANSCRIPT_TAG,
            [
                hello.job,
                hello.site,
                str(hello.role),
                list(hello.versions),
                hello.nonce,
                hello.max_frame,
                _canonical_info(hello.info),
            ],
            [
                welcome.job,
                welcome.site,
                str(welcome.role),
                list(welcome.versions),
                welcome.version,
                welcome.nonce,
                welcome.max_frame,
                _canonical_info(welcome.info),
            ],
        ],
        use_bin_type=True,
    )


def server_proof(secret: bytes, hello: Hello, welcome: Welcome) -> bytes:
    """What the server puts in Welcome.proof (``welcome.proof`` itself is ignored)."""
    return hmac.new(secret, _SERVER_LABEL + transcript(hello, welcome), hashlib.sha256).digest()


def client_proof(secret: bytes, hello: Hello, welcome: Welcome) -> bytes:
    """What the client puts in Auth.proof."""
    return hmac.new(secret, _CLIENT_LABEL + transcript(hello, welcome), hashlib.sha256).digest()


def proof_matches(expected: bytes, received: bytes) -> bool:
    return hmac.compare_digest(expected, received)
