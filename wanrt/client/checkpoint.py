"""The client's checkpoint: what ``SparseOptimizer.state_dict()`` holds and how a run resumes from it.

A wanrt run is resumed at the checkpoint's WAN iteration (``wanrt.init(..., resume_at=it)``: the gateways
let it in only there), so a checkpoint records, beside the optimizer kernel's per-parameter state and the
user's ``lr``, everything that decides the next iterations' arithmetic: the live ``lr_scale``, the density,
staleness, local steps and batch weight in force (they may differ from the run's config after scheduler
decisions), and on the site leader the error-feedback residuals and compressor thresholds. A run resumed
from it continues exactly where this one stopped (docs/client.md, "Checkpoints"). The context checks
*when* a checkpoint may be taken or loaded; this module says *what* it is.
"""

from __future__ import annotations

from typing import Any

from wanrt.client.leader.device_path import DeviceLayerCompressor
from wanrt.client.site.settings_in_force import SettingsInForce
from wanrt.errors import ConfigError, LocalProtocolError
from wanrt.kernels import SparseOptimizer as KernelOptimizer

__all__ = [
    "CHECKPOINT_FORMAT",
    "check_checkpoint",
    "check_checkpointable",
    "checkpoint_state",
    "restore_checkpoint",
]

#: what SparseOptimizer.state_dict() says it is (load_state_dict refuses anything else)
CHECKPOINT_FORMAT = "wanrt-sparse-optimizer-1"


def check_checkpointable(
    iteration: int, *, micro: int, resync_pending: bool, in_flight: list[tuple[int, int]]
) -> None:
    """A checkpoint taken now would resume exactly where the run stands, else a LocalProtocolError that
    says when to take it: not between micro-steps, not while a parameter snapshot is pending, and with no
    update in flight (a run resumed from it would miss them)."""
    if micro:
        raise LocalProtocolError(
            f"state_dict() between the micro-steps of iteration {iteration}",
            hint="checkpoint after the last micro-step of a WAN iteration",
        )
    if resync_pending:
        raise LocalProtocolError(
            "state_dict() while this site waits for the job's parameters (a parameter resync)",
            hint="checkpoint at another site, or a few steps later",
        )
    if in_flight:
        it, layer = in_flight[0]
        raise LocalProtocolError(
            f"state_dict() with {len(in_flight)} updates in flight (iteration {it} layer {layer}): a run "
            "resumed from it would miss them",
            hint="call ctx.close() first (it applies every outstanding update), or use staleness 0",
        )


def checkpoint_state(
    iteration: int,
    optimizer: KernelOptimizer,
    settings: SettingsInForce,
    compressor: DeviceLayerCompressor | None,
) -> dict[str, Any]:
    """The checkpoint of a run at the start of WAN iteration ``iteration``."""
    return {
        "format": CHECKPOINT_FORMAT,
        "iteration": iteration,
        "kernel": optimizer.state_dict(),
        "lr_scale": optimizer.lr_scale,
        "settings": settings.checkpoint(),
        "compression": None if compressor is None else compressor.state_dict(),
    }


def check_checkpoint(state: object, iteration: int) -> dict[str, Any]:
    """``state`` is a wanrt checkpoint of WAN iteration ``iteration`` (where this run continues), else a
    :class:`ConfigError` that says how to resume from it."""
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise ConfigError(
            "not a wanrt SparseOptimizer state_dict (format "
            f"{state.get('format') if isinstance(state, dict) else type(state).__name__!r})",
            key="state_dict",
        )
    it = state.get("iteration")
    if type(it) is not int or it != iteration:
        raise ConfigError(
            f"this checkpoint is of iteration {it}, but this run continues at iteration "
            f"{iteration}: pass resume_at={it} to wanrt.init to resume from it",
            key="resume_at",
            value=it,
        )
    return state


def restore_checkpoint(
    state: dict[str, Any],
    optimizer: KernelOptimizer,
    settings: SettingsInForce,
    compressor: DeviceLayerCompressor | None,
) -> None:
    """Put a checked checkpoint (:func:`check_checkpoint`) in force: kernel state, ``lr_scale``, the live
    settings, and (leader) the compressor's residuals and thresholds."""
    table = state.get("settings")
    if not isinstance(table, dict):
        raise ConfigError("the checkpoint lacks its 'settings' table", key="state_dict")
    optimizer.load_state_dict(state["kernel"])
    optimizer.lr_scale = float(state.get("lr_scale", 1.0))
    settings.restore(table)
    if compressor is not None:
        compressor.set_density(settings.config.density)
        comp = state.get("compression")
        if isinstance(comp, dict):
            compressor.load_state_dict(comp)
