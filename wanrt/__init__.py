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
    RestartRequested,
    TransportError,
    UnsupportedValueCoding,
    WanrtError,
    WanrtTimeout,
)
from wanrt.payload import SparsePayload

if TYPE_CHECKING:
    from wanrt.client import ClientConfig, Context, DiLoCo, SparseOptimizer, init

__version__ = "0.1.0"

__all__ = [
    "AuthError",
    "ClientConfig",
    "ConfigError",
    "Context",
    "DiLoCo",
    "KernelError",
    "LimitExceeded",
    "LocalProtocolError",
    "MalformedPayload",
    "PeerLost",
    "ProtocolError",
    "RemoteProtocolError",
    "RestartRequested",
    "SparseOptimizer",
    "SparsePayload",
    "TransportError",
    "UnsupportedValueCoding",
    "WanrtError",
    "WanrtTimeout",
    "__version__",
    "init",
    "restart_count",
]

#: trainer-client names resolved on first use, so ``import wanrt`` never imports torch
_CLIENT_NAMES = frozenset({"ClientConfig", "Context", "DiLoCo", "SparseOptimizer", "init"})


def restart_count() -> int:
    """How many times the launcher restarted this worker group: torchrun's ``TORCHELASTIC_RESTART_COUNT``
    (0 on the first start, and outside torchrun). A trainer restarted after a scheduler's KILL_RESTART
    (:class:`RestartRequested`) sees 1 or more; wanrt itself does not need it (the gateway tells a restarted
    trainer where the job is), but logs and tests may."""
    import os

    raw = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    try:
        n = int(raw)
    except ValueError:
        raise ConfigError(
            "TORCHELASTIC_RESTART_COUNT is not an integer", key="TORCHELASTIC_RESTART_COUNT", value=raw
        ) from None
    if n < 0:
        raise ConfigError(
            "TORCHELASTIC_RESTART_COUNT is negative", key="TORCHELASTIC_RESTART_COUNT", value=raw
        )
    return n


def __getattr__(name: str) -> Any:
    if name in _CLIENT_NAMES:
        import wanrt.client

        return getattr(wanrt.client, name)
    raise AttributeError(f"module 'wanrt' has no attribute {name!r}")
