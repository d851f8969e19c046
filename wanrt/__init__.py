"""wanrt: data-parallel PyTorch training across GPU clusters joined by a slow, fluctuating WAN.

Importing this package has no side effects: no event loop policy, no threads, no sockets, no CUDA.
"""

from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from wanrt.client import ClientConfig, Context, SparseOptimizer, init

__version__ = "0.1.0"

__all__ = [
    "AuthError",
    "ClientConfig",
    "ConfigError",
    "Context",
    "KernelError",
    "LimitExceeded",
    "LocalProtocolError",
    "MalformedPayload",
    "PeerLost",
    "ProtocolError",
    "RemoteProtocolError",
    "SparseOptimizer",
    "SparsePayload",
    "TransportError",
    "WanrtError",
    "WanrtTimeout",
    "__version__",
    "init",
]

#: trainer-client names resolved on first use, so ``import wanrt`` never imports torch
_CLIENT_NAMES = frozenset({"ClientConfig", "Context", "SparseOptimizer", "init"})


def __getattr__(name: str) -> Any:
    if name in _CLIENT_NAMES:
        import wanrt.client

        return getattr(wanrt.client, name)
    raise AttributeError(f"module 'wanrt' has no attribute {name!r}")
