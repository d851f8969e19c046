"""wanrt: data-parallel PyTorch training across GPU clusters joined by a slow, fluctuating WAN.

Importing this package has no side effects: no event loop policy, no threads, no sockets, no CUDA.
"""

from wanrt.errors import (
    AuthError,
    ConfigError,
    KernelError,
    LimitExceeded,
    LocalProtocolError,
    MalformedPayload,
    PeerLost,
    ProtocolError,
    RemoteProtocolError,
    TransportError,
    WanrtError,
    WanrtTimeout,
)
from wanrt.payload import SparsePayload

__version__ = "0.1.0"

__all__ = [
    "AuthError",
    "ConfigError",
    "KernelError",
    "LimitExceeded",
    "LocalProtocolError",
    "MalformedPayload",
    "PeerLost",
    "ProtocolError",
    "RemoteProtocolError",
    "SparsePayload",
    "TransportError",
    "WanrtError",
    "WanrtTimeout",
    "__version__",
]
