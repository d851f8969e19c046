"""The gateway as one sans-IO object (:class:`GatewayNode`), its per-link channel and its actions.

Driven by the asyncio daemon (:mod:`gateways.service`) and by the simulator (:mod:`sims`) alike.
"""

from gateways.node.actions import CloseLink, NodeAction, RefuseTrainer, ToScheduler, ToTrainer, Wake
from gateways.node.node import MAX_BACKLOG, GatewayNode
from gateways.node.peer_channel import PeerChannel, SendOut

__all__ = [
    "MAX_BACKLOG",
    "CloseLink",
    "GatewayNode",
    "NodeAction",
    "PeerChannel",
    "RefuseTrainer",
    "SendOut",
    "ToScheduler",
    "ToTrainer",
    "Wake",
]
