"""The typed decisions the straggler policy outputs (AntDT Table II's action set, plus STAR's modes).

AntDT separates *node actions* (KILL_RESTART: one node, no coordination) from *global actions*
(ADJUST_BS, BACKUP_WORKERS, ADJUST_LR: every node must apply them at the same iteration, §V-E1/§V-F);
the scheduler daemon that announces these decisions picks that iteration — these objects only say what.
STAR's synchronisation modes map onto them: x-order is a BACKUP_WORKERS decision (an update uses the
first x reports), parent–child and the latency tree are plan changes for the gateways, and a mode switch
comes with ADJUST_LR (STAR §IV-C). How each maps onto gateway settings is in docs/stragglers.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar, Literal, TypeAlias

__all__ = [
    "Action",
    "AdjustBatch",
    "AdjustLr",
    "BackupWorkers",
    "KillRestart",
    "NoAction",
    "ParentChild",
    "StragglerDecision",
    "TreeRebuild",
]


class Action(StrEnum):
    ADJUST_BS = "ADJUST_BS"
    BACKUP_WORKERS = "BACKUP_WORKERS"
    PARENT_CHILD = "PARENT_CHILD"
    TREE = "TREE"
    ADJUST_LR = "ADJUST_LR"
    KILL_RESTART = "KILL_RESTART"
    NONE = "NONE"


@dataclass(frozen=True)
class AdjustBatch:
    """New per-rank batch sizes (Σ = the global batch); ``steps`` = gradient-accumulation steps (Eq. 4)."""

    action: ClassVar[Action] = Action.ADJUST_BS
    at: float
    batch: Mapping[str, int]
    predicted_bpt_s: float  # Eq. 2's max_i B_i / v_i under the new sizes
    previous_bpt_s: float  # the same under the sizes being replaced
    reason: str
    steps: Mapping[str, int] | None = None


@dataclass(frozen=True)
class BackupWorkers:
    """Which reports an update uses: ``bsp`` all of them, ``x_order`` the first ``order`` to arrive,
    ``dynamic`` each group of ``groups`` on its own (STAR §IV-B)."""

    action: ClassVar[Action] = Action.BACKUP_WORKERS
    at: float
    mode: Literal["bsp", "x_order", "dynamic"]
    order: int
    groups: tuple[tuple[str, ...], ...]
    predicted_s: float  # Eq. 1/2 time to the reference progress
    reason: str


@dataclass(frozen=True)
class ParentChild:
    """STAR §IV-B all-reduce mode: ``parents[child]`` is the ring member that waits ``wait_s`` for it."""

    action: ClassVar[Action] = Action.PARENT_CHILD
    at: float
    ring: tuple[str, ...]
    parents: Mapping[str, str]
    wait_s: float
    predicted_s: float  # Eq. 3 time to the reference progress
    reason: str


@dataclass(frozen=True)
class TreeRebuild:
    """STAR §IV-D2 tree: ``parents[site]`` (None for the root), built from ``costs`` with ``arity``."""

    action: ClassVar[Action] = Action.TREE
    at: float
    parents: Mapping[str, str | None]
    costs: tuple[tuple[str, float], ...]
    arity: int
    reason: str


@dataclass(frozen=True)
class AdjustLr:
    """Learning rate per member after a mode switch: ``r_new = (M_new/M)·r_SSGD`` (STAR §IV-C)."""

    action: ClassVar[Action] = Action.ADJUST_LR
    at: float
    lr: Mapping[str, float]
    reason: str


@dataclass(frozen=True)
class KillRestart:
    """Replace a persistent straggler (AntDT §VI-A4), only when the cluster is not busy."""

    action: ClassVar[Action] = Action.KILL_RESTART
    at: float
    member: str
    scope: str
    reason: str


@dataclass(frozen=True)
class NoAction:
    action: ClassVar[Action] = Action.NONE
    at: float
    reason: str


StragglerDecision: TypeAlias = (
    AdjustBatch | BackupWorkers | ParentChild | TreeRebuild | AdjustLr | KillRestart | NoAction
)
