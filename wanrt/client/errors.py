"""The mistakes a trainer can make, each with one message that says what to do about it.

They all derive from :class:`wanrt.errors.WanrtError` (and the nearest existing class, so that a caller
catching ``TransportError`` or ``ConfigError`` still catches them) and carry a ``hint`` field: the message
says what went wrong, the hint says the most likely fix, and both show in ``str(exc)``.
"""

from __future__ import annotations

from typing import Any

from wanrt.errors import ConfigError, LocalProtocolError, TransportError, WanrtError

__all__ = [
    "DistributedNotInitialized",
    "GatewayUnreachable",
    "LeaderFailed",
    "ModelMismatch",
    "RunRefused",
    "SiteFailed",
    "StepWithoutBackward",
    "TensorMismatch",
    "UnknownTensor",
    "UnsupportedTensorDtype",
]


class GatewayUnreachable(TransportError):
    """The site leader could not connect to its gateway (URL in the message)."""

    def __init__(self, url: str, cause: str) -> None:
        super().__init__(
            f"cannot reach the wanrt gateway at {url}: {cause}",
            url=url,
            hint="start `wanrt gateway --config <site>.toml` for this site, or fix gateway= in wanrt.init()",
        )


class ModelMismatch(WanrtError):
    """The model differs between sites (or between ranks of one site); names the first differing layer."""

    def __init__(self, message: str, *, layer: int | None = None, name: str | None = None, **f: Any):
        super().__init__(
            message,
            layer=layer,
            name=name,
            hint="every rank of every site must build the same model (same parameter names and shapes)",
            **f,
        )


class DistributedNotInitialized(ConfigError):
    """torch.distributed is not initialised and the environment does not say how to initialise it."""

    def __init__(self, missing: list[str]) -> None:
        ConfigError.__init__(
            self,
            "torch.distributed is not initialised and the environment lacks " + ", ".join(missing),
        )
        self.fields["hint"] = (
            "launch with torchrun (one torchrun per site), or call "
            "torch.distributed.init_process_group() before wanrt.init()"
        )
        self.hint = self.fields["hint"]


class StepWithoutBackward(LocalProtocolError):
    """``step()`` was called although no gradient was produced since the last step."""

    def __init__(self, iteration: int) -> None:
        super().__init__(
            f"step() called without backward() at iteration {iteration}: no parameter received a gradient",
            iteration=iteration,
            hint="call loss.backward() before opt.step(), once per step",
        )


class LeaderFailed(WanrtError):
    """Seen on non-leader ranks: the site leader hit an error and told the site to stop."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(
            f"site leader (rank 0) failed with {kind}: {message}",
            kind=kind,
            hint="see rank 0's traceback for the cause",
        )


class SiteFailed(WanrtError):
    """Another site cannot train as configured (its gateway said why); the job cannot go on as it is."""

    def __init__(self, site: str, kind: str, message: str) -> None:
        super().__init__(
            f"site {site} failed ({kind}): {message}",
            site=site,
            kind=kind,
            hint=f"fix site {site} (see its gateway's log) and restart the job",
        )


class RunRefused(ConfigError):
    """The site's gateway serves another training run of this job and will not serve this one (raised by
    ``wanrt.init``, before anything trains): a run that finished there (its trainers closed), or one
    whose trainer is still connected. The restart of a run whose trainer *died* is not refused: it rejoins
    (docs/client.md, "When a trainer crashes")."""

    def __init__(self, url: str, reason: str) -> None:
        ConfigError.__init__(self, f"gateway {url} refused this run: {reason}", key="run")
        self.fields["hint"] = (
            "restart the gateways for a new run, or resume the old one from its checkpoint "
            "(wanrt.init(..., resume_at=N))"
        )
        self.hint = self.fields["hint"]


class UnknownTensor(LocalProtocolError):
    """``ctx.all_reduce`` named a tensor that was not registered with ``ctx.register_tensors``."""

    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(
            f"no tensor named {name!r} is registered for all_reduce "
            f"(registered: {', '.join(known) or 'none'})",
            name=name,
            hint="register every tensor by name and shape before the first all_reduce: "
            "ctx.register_tensors({name: tensor, ...}) on every rank of every site",
        )


class TensorMismatch(LocalProtocolError):
    """``ctx.all_reduce`` got a tensor whose shape differs from the one registered under its name (a
    mismatch *between sites* is a :class:`ModelMismatch` at registration, as for a model)."""

    def __init__(self, name: str, registered: tuple[int, ...], got: tuple[int, ...]) -> None:
        super().__init__(
            f"tensor {name!r} was registered with shape {registered}, all_reduce got {got}",
            name=name,
            hint="all_reduce the tensor registered under this name (its shape is in the job's signature)",
        )


class UnsupportedTensorDtype(LocalProtocolError):
    """The tensor API averages floating-point tensors only (they travel as fp32 or the wire dtype)."""

    def __init__(self, name: str, dtype: str) -> None:
        super().__init__(
            f"tensor {name!r} has dtype {dtype}: all_reduce averages floating-point tensors only",
            name=name,
            hint="cast to float32 (integer counts: average their float32 copy and round)",
        )
