"""Finding (or creating) the site's torch.distributed process group.

One process group per *site*: torchrun (or the user) initialises the default group with the site's ranks,
and rank 0 of that group is the site leader. If it is not initialised yet we initialise it from the
standard environment variables torchrun sets, with gloo on CPU and NCCL when CUDA is available; if those
are missing too, the user gets one error that says how to launch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta

import torch
import torch.distributed as dist

from wanrt.client.errors import DistributedNotInitialized

__all__ = ["REQUIRED_ENV", "comm_device", "ensure_process_group"]

REQUIRED_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def ensure_process_group(env: Mapping[str, str] | None = None, *, timeout_s: float = 600.0) -> bool:
    """Initialise the default group from ``env`` (torchrun's variables) unless it already exists; True if
    this call created it (then :meth:`Context.close` destroys it again: the user never had it)."""
    if dist.is_initialized():
        return False
    env = os.environ if env is None else env
    missing = [k for k in REQUIRED_ENV if not env.get(k)]
    if missing:
        raise DistributedNotInitialized(missing)
    backend = default_backend()
    if backend == "nccl" and env.get("LOCAL_RANK"):
        torch.cuda.set_device(int(env["LOCAL_RANK"]))
    timeout = timedelta(seconds=timeout_s)
    attempt = env.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None:
        dist.init_process_group(backend=backend, timeout=timeout)
        return True
    # Under torchrun the agent's store outlives a restart of the worker group (KILL_RESTART,
    # docs/stragglers.md): without a key prefix per attempt, gloo of the restarted group reads the old
    # group's addresses from it and fails with "connectFullMesh ... Connection refused" (torch 2.13).
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    agent = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # else rank 0 hosts it, as env:// does
    store = dist.TCPStore(
        env["MASTER_ADDR"], int(env["MASTER_PORT"]), world, is_master=not agent and rank == 0, timeout=timeout
    )
    prefixed = dist.PrefixStore(f"wanrt/attempt_{attempt}", store)
    dist.init_process_group(backend=backend, store=prefixed, rank=rank, world_size=world, timeout=timeout)
    return True


def comm_device(group: dist.ProcessGroup | None) -> torch.device:
    """Where tensors must live to be broadcast in ``group`` (NCCL needs the current CUDA device)."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
