"""The seam between the training thread and whatever carries payloads to the gateway.

The context only needs four things from a link: push a layer's payload, get the next event (an update or
a configuration change) with a timeout, and close. Keeping that behind this small interface lets tests run
the whole client against an in-process fake, and keeps the asyncio machinery of the real link
(:mod:`wanrt.client.link.gateway_link`) out of the training thread.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from wanrt.client.config import ClientConfig
from wanrt.client.link.param_resync import Snapshot
from wanrt.client.link.reconnect import ReconnectPolicy
from wanrt.client.link.signature import LayerSignature
from wanrt.client.site.decision import ConfigChange
from wanrt.payload import SparsePayload

__all__ = [
    "Link",
    "LinkEvent",
    "LinkFactory",
    "LinkSpec",
    "ResyncAbandoned",
    "ResyncStarted",
    "ServeRequested",
    "SnapshotArrived",
    "UpdateArrived",
]


@dataclass(frozen=True)
class UpdateArrived:
    """The gateway's ``Aggregate``: the *sum* over ``sites`` of one layer's payloads for one iteration."""

    iteration: int
    layer: int
    payload: SparsePayload
    sites: tuple[str, ...]


@dataclass(frozen=True)
class ResyncStarted:
    """This site missed the job's rounds before ``iteration``: the job's parameters were asked for; hold
    the updates that arrive until the snapshot is in (docs/client.md, "Parameter resync")."""

    iteration: int


@dataclass(frozen=True)
class SnapshotArrived:
    """The job's parameters (checked against this model), to swap in at the next step."""

    snapshot: Snapshot


@dataclass(frozen=True)
class ResyncAbandoned:
    """No site will send the parameters (the gateway has no resync pending): apply the held updates."""


@dataclass(frozen=True)
class ServeRequested:
    """A peer site asks for this site's parameters as of iteration ``iteration`` (answer with the link's
    ``send_params`` once every update below it is applied)."""

    request: int
    iteration: int
    state: int = 0  # optimizer-state arrays the asking trainer can take (send yours if yours match)


LinkEvent = UpdateArrived | ConfigChange | ResyncStarted | SnapshotArrived | ResyncAbandoned | ServeRequested


@dataclass(frozen=True)
class LinkSpec:
    """Everything needed to open the site leader's link to its gateway."""

    url: str
    site: str
    job: str
    secret: bytes
    signature: LayerSignature
    config: ClientConfig
    #: this training run's id (random per ``wanrt.init``): a gateway still serving another run refuses
    #: the connection with a message instead of taking the new pushes for the old run's re-sends
    run: str = ""
    #: lengths of the optimizer's state arrays (:func:`wanrt.kernels.state_transfer.state_lengths`): a
    #: parameter resync fetches them with the parameters
    state_lengths: tuple[int, ...] = ()
    #: the iteration of the checkpoint this run resumes from (None: not a resume); the gateway lets a
    #: resume in only where the job stopped at this site (gateways.node.trainer_runs)
    resume_at: int | None = None
    #: reconnecting to a gateway that was lost (restarted): wanrt.client.link.reconnect
    reconnect: ReconnectPolicy = field(default_factory=ReconnectPolicy)


class Link(Protocol):
    """A connected, authenticated channel from the site leader to its gateway. Thread-safe per call."""

    def push(self, iteration: int, layer: int, payload: SparsePayload) -> None:
        """Queue a payload for sending; never blocks on the network. Raises the link's error if it died."""
        ...

    def get(self, timeout: float) -> LinkEvent | None:
        """Next event, waiting at most ``timeout`` s (``None`` if none came). Raises the link's error."""
        ...

    def telemetry(self, iteration: int, metrics: dict[str, float]) -> None:
        """Queue this site's measurements of ``iteration`` for the gateway (and the scheduler behind it)."""
        ...

    def close(self, timeout: float) -> None:
        """Flush queued pushes, say goodbye and close, within ``timeout`` s. Idempotent."""
        ...


#: Opens a link (connect + handshake); raises GatewayUnreachable, AuthError or ModelMismatch.
LinkFactory = Callable[[LinkSpec], Link]
